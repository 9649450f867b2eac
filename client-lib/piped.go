package larder

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A read-only transaction's first read that misses is sent with the
// transaction's BEGIN, its snapshot import and its tables' locks and
// storage check, in one round trip (a pipeline of extended-protocol
// statements ending in one Sync) instead of two. The lock comes before the
// read in the pipeline, and the read's result is used only once the check
// (read first) has passed, exactly as when the read follows in a second
// round trip.
//
// The read runs as a statement the connection keeps prepared
// (prepared.go), or, past the connection's bound, as an unnamed statement
// with the parameter types a description cache holds (learnt once per
// statement and schema epoch by a Describe). A read that fails there (a
// statement or description gone stale, or any other error) ends the
// pipelined attempt before any storage check: the transaction begins
// again at the same pin and the read runs the usual way, which gives the
// answer a read not pipelined would have. A pipelined read is not shared with a
// concurrent identical miss of the client (its begin could wait for a
// lock, and no waiter may wait for a load that does); later misses are.

// pipedRead is the read a transaction's first miss sends with its begin.
type pipedRead struct {
	sql   string
	args  []any
	scope string // the session's key scope: statements resolve in it
	res   *Result
	ran   bool // res holds the read's result
}

// descCache holds statement descriptions (parameter and result types) for
// pipelined reads, by scope and SQL, for one schema epoch.
type descCache struct {
	mu    sync.Mutex
	epoch uint64
	m     map[descKey]*pgconn.StatementDescription
}

type descKey struct{ scope, sql string }

// maxDescriptions bounds the descriptions held (then none are added).
const maxDescriptions = 4096

func (d *descCache) get(epoch uint64, k descKey) *pgconn.StatementDescription {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != epoch {
		d.epoch, d.m = epoch, nil
	}
	return d.m[k]
}

func (d *descCache) put(epoch uint64, k descKey, sd *pgconn.StatementDescription) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.epoch != epoch {
		d.epoch, d.m = epoch, nil
	}
	if d.m == nil {
		d.m = map[descKey]*pgconn.StatementDescription{}
	}
	if len(d.m) < maxDescriptions {
		d.m[k] = sd
	}
}

func (d *descCache) drop(k descKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, k)
}

// pipeable reports whether a read with args can be pipelined: plain
// arguments, none of pgx's per-query options and no statement a client
// sent over the wire (raw.go).
func pipeable(args []any) bool {
	if _, ok := wireOf(args); ok {
		return false
	}
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryRewriter, pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
	}
	return true
}

// errPipeAgain: the pipelined read failed; the transaction, closed, is to
// begin again at the same pin without it.
var errPipeAgain = errors.New("larder: the pipelined read failed; begin again without it")

// beginPiped runs begin's statements (BEGIN, the import of snapshot, the
// tables' lock and check) and q's read in one round trip, each but the
// import as a statement the connection keeps prepared (prepared.go). It
// returns false when q cannot be pipelined on this connection (nothing
// was sent).
func (t *ROTx) beginPiped(ctx context.Context, snapshot string, plan *holdPlan, ts uint64, q *pipedRead) (bool, error) {
	pc := pgxConnOf(t.conn)
	epoch := t.c.epoch.Load()
	set := preparedSetOf(pc, epoch, t.c.m)
	k := descKey{scope: q.scope, sql: q.sql}
	named := set.prepare(ctx, pc.PgConn(), t.c.m, q.sql)
	sd := named
	if sd == nil {
		sd = t.c.descs.get(epoch, k)
	}
	if sd == nil {
		// Described once (outside any transaction: the unnamed statement
		// is replaced by the pipeline's own).
		var err error
		if sd, err = pc.PgConn().Prepare(ctx, "", q.sql, nil); err != nil {
			return false, nil // the usual path reports it
		}
		t.c.descs.put(epoch, k, sd)
	}
	if len(sd.ParamOIDs) != len(q.args) {
		return false, nil
	}
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(pc.TypeMap(), sd, q.args); err != nil {
		return false, nil
	}
	resultFormats := eqb.ResultFormats
	if t.sqlFormats {
		resultFormats = make([]int16, len(sd.Fields))
		for i, f := range sd.Fields {
			resultFormats[i] = databaseSQLResultFormats[f.DataTypeOID]
		}
	}
	stmts := []string{beginReadOnly, setSnapshot + "'" + snapshot + "'"}
	if plan != nil {
		stmts = append(stmts, plan.statements()...)
	}
	b := &pgconn.Batch{}
	for _, s := range stmts {
		if psd := set.prepare(ctx, pc.PgConn(), t.c.m, s); psd != nil {
			b.ExecPrepared(psd.Name, nil, nil, nil)
			continue
		}
		b.ExecParams(s, nil, nil, nil, nil) // the import
	}
	if named != nil {
		b.ExecPrepared(named.Name, eqb.ParamValues, eqb.ParamFormats, resultFormats)
	} else {
		b.ExecParams(q.sql, eqb.ParamValues, sd.ParamOIDs, eqb.ParamFormats, resultFormats)
	}
	mrr := pc.PgConn().ExecBatch(ctx, b)
	var results []*pgconn.Result
	var res *Result
	var readErr error
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		if len(results) < len(stmts) {
			r := rr.Read()
			results = append(results, r)
			if r.Err != nil {
				break
			}
			continue
		}
		res, readErr = readRaw(rr)
	}
	err := mrr.Close()
	stale := stalePrepared(err) || stalePrepared(readErr)
	for _, r := range results {
		stale = stale || stalePrepared(r.Err)
	}
	if stale {
		set.drop(t.c.m)
	}
	if len(results) < len(stmts) || results[len(results)-1].Err != nil {
		// BEGIN, the import or the hold failed: as begin's own failure.
		_ = t.closeConn(ctx)
		if err == nil {
			err = errors.New("larder: the transaction's begin gave no answer")
		}
		if stale {
			// A prepared statement was gone: begin again, the usual way.
			return true, errPipeAgain
		}
		return true, err
	}
	if err != nil || readErr != nil || res == nil {
		// The read failed (its description may be stale) and aborted the
		// transaction: no check can run in it (a storage that moved would
		// take a second round trip). Again, the usual way, which holds and
		// checks the tables anew.
		t.c.descs.drop(k)
		_ = t.closeConn(ctx)
		return true, errPipeAgain
	}
	if plan != nil {
		if err := t.checkHeld(ctx, plan, results, ts); err != nil {
			_ = t.closeConn(ctx)
			return true, err
		}
	}
	q.res, q.ran = res, true
	return true, nil
}

// readRaw drains a result reader into a Result.
func readRaw(rr *pgconn.ResultReader) (*Result, error) {
	r := &Result{Fields: append([]pgconn.FieldDescription(nil), rr.FieldDescriptions()...)}
	for rr.NextRow() {
		r.Rows = append(r.Rows, copyRow(rr.Values()))
	}
	_, err := rr.Close()
	return r, err
}
