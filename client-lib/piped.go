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
// statements ending in one Sync) instead of two. So is a later miss that
// reads tables the transaction holds not yet, with their locks and check
// (holdPiped), in a transaction begun at a pin: if that read fails, the
// transaction begins again at the pin and the read runs the usual way.
// The lock comes before the read in the pipeline, and the read's result
// is used only once the check (read first) has passed, exactly as when
// the read follows in a second round trip.
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
// was sent). Whatever failed, the transaction ends here: it holds locks,
// and a later attempt begins anew (errPipeAgain: the usual way, which
// holds and checks the tables anew).
func (t *ROTx) beginPiped(ctx context.Context, snapshot string, plan *holdPlan, ts uint64, q *pipedRead) (bool, error) {
	stmts := []string{beginReadOnly, setSnapshot + "'" + snapshot + "'"}
	if plan != nil {
		stmts = append(stmts, plan.statements()...)
	}
	p := t.pipeRead(ctx, stmts, q)
	if !p.sent {
		return false, nil
	}
	err := t.pipedOutcome(ctx, p, plan, ts, q)
	if err != nil {
		_ = t.closeConn(ctx)
	}
	return true, err
}

// holdPiped holds the tables of plan (their lock and storage check) and
// runs q's read in one round trip, in a transaction begun at a pin
// already: a later miss that reads tables not held yet. It returns false
// when q cannot be pipelined (nothing was sent), and errPipeAgain when the
// pipelined read failed and aborted the transaction, which is to begin
// again at its pin and read the usual way.
func (t *ROTx) holdPiped(ctx context.Context, plan *holdPlan, ts uint64, q *pipedRead) (bool, error) {
	p := t.pipeRead(ctx, plan.statements(), q)
	if !p.sent {
		return false, nil
	}
	return true, t.pipedOutcome(ctx, p, plan, ts, q)
}

// pipedOutcome reads what a pipeline sent (pipeRead) answered. A statement
// before the read that failed is the pipeline's failure, or errPipeAgain
// when a prepared statement was gone. A read that failed (its description
// may be stale) aborted the transaction, so no check can run in it (a
// storage that moved would take a second round trip): errPipeAgain. Else
// the tables' check (plan, when there is one) decides whether q gets the
// read's result.
func (t *ROTx) pipedOutcome(ctx context.Context, p piped, plan *holdPlan, ts uint64, q *pipedRead) error {
	if p.stmtsFailed() {
		if p.stale {
			return errPipeAgain
		}
		return p.err
	}
	if p.readFailed() {
		return errPipeAgain
	}
	if plan != nil {
		if err := t.checkHeld(ctx, plan, p.results, ts); err != nil {
			return err
		}
	}
	q.res, q.ran = p.res, true
	return nil
}

// piped is what pipeRead sent and read.
type piped struct {
	sent    bool
	n       int              // statements before the read
	results []*pgconn.Result // theirs, up to the first that failed
	res     *Result          // the read's, when it ran
	readErr error            // the read's error
	err     error            // the pipeline's (or that a statement gave no answer)
	stale   bool             // a prepared statement or description was stale
}

// stmtsFailed: a statement before the read failed (or gave no answer).
func (p *piped) stmtsFailed() bool {
	return len(p.results) < p.n || (p.n > 0 && p.results[p.n-1].Err != nil)
}

// readFailed: the statements ran, the read did not.
func (p *piped) readFailed() bool { return p.err != nil || p.readErr != nil || p.res == nil }

// pipeRead sends stmts and q's read in one round trip (a pipeline ending
// in one Sync), each statement prepared on the connection but a snapshot
// import. A read that fails drops its description (it may be stale).
func (t *ROTx) pipeRead(ctx context.Context, stmts []string, q *pipedRead) piped {
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
			return piped{} // the usual path reports it
		}
		t.c.descs.put(epoch, k, sd)
	}
	if len(sd.ParamOIDs) != len(q.args) {
		return piped{}
	}
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(pc.TypeMap(), sd, q.args); err != nil {
		return piped{}
	}
	resultFormats := eqb.ResultFormats
	if t.sqlFormats {
		resultFormats = make([]int16, len(sd.Fields))
		for i, f := range sd.Fields {
			resultFormats[i] = databaseSQLResultFormats[f.DataTypeOID]
		}
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
	p := piped{sent: true, n: len(stmts)}
	mrr := pc.PgConn().ExecBatch(ctx, b)
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		if len(p.results) < len(stmts) {
			r := rr.Read()
			p.results = append(p.results, r)
			if r.Err != nil {
				break
			}
			continue
		}
		p.res, p.readErr = readRaw(rr)
	}
	p.err = mrr.Close()
	p.stale = stalePrepared(p.err) || stalePrepared(p.readErr)
	for _, r := range p.results {
		p.stale = p.stale || stalePrepared(r.Err)
	}
	if p.stale {
		set.drop(t.c.m)
	}
	switch {
	case p.stmtsFailed():
		if p.err == nil {
			p.err = errors.New("larder: the transaction's begin gave no answer")
		}
	case p.readFailed():
		t.c.descs.drop(k)
	}
	return p
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
