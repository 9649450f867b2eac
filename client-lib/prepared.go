package larder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of a pipelined begin (piped.go) run as statements the
// connection keeps prepared, as pgx's own statement cache does for the
// reads that follow: PostgreSQL then parses and plans BEGIN, the tables'
// lock, the storage check and the read once per connection, not once per
// transaction. For a read by key, parsing and planning cost PostgreSQL
// more than the read.
//
// Each connection holds its own set (in its pgconn CustomData), at most
// maxPreparedPerConn statements, named larder_<generation>_<hash of the
// SQL>. A set is dropped when the client's schema epoch moves on and when
// PostgreSQL answers that a statement is gone (26000: DISCARD or
// DEALLOCATE ran on the connection) or that its plan no longer gives its
// result type (0A000): the names are deallocated before the connection's
// next pipelined begin, and the next generation prepares anew. Statements
// that name a snapshot (SET TRANSACTION SNAPSHOT) are not prepared: each
// pin would take a statement of its own. A fresh snapshot's begin
// (beginNow) and the lock and check of tables a transaction reads later
// (holdTables) run as prepared statements too.

// maxPreparedPerConn bounds the statements one connection keeps prepared;
// past it, statements run unnamed (parsed and planned each time).
const maxPreparedPerConn = 256

// preparedSetKey is the connection's set in its pgconn CustomData.
const preparedSetKey = "larder.prepared"

// preparedSet is the statements one connection keeps prepared.
type preparedSet struct {
	epoch      uint64
	generation int
	stmts      map[string]*pgconn.StatementDescription // by SQL
	stale      []string                                // names to deallocate
}

// preparedSetOf returns conn's set at epoch (a set of an older epoch is
// dropped), or nil when conn runs its statements unnamed: a connection
// not in pgx's statement-cache mode keeps the statement names of its
// session to whoever owns it (the wire front's sessions are their
// clients').
func preparedSetOf(conn *pgx.Conn, epoch uint64, m *clientMetrics) *preparedSet {
	if conn.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	data := conn.PgConn().CustomData()
	s, _ := data[preparedSetKey].(*preparedSet)
	if s == nil {
		s = &preparedSet{epoch: epoch}
		data[preparedSetKey] = s
	}
	if s.epoch != epoch {
		s.drop(m)
		s.epoch = epoch
	}
	return s
}

// drop forgets every statement of the set; their names are deallocated
// before the connection's next pipelined begin.
func (s *preparedSet) drop(m *clientMetrics) {
	if s == nil {
		return
	}
	m.prepared.WithLabelValues("dropped").Add(float64(len(s.stmts)))
	for _, sd := range s.stmts {
		s.stale = append(s.stale, sd.Name)
	}
	s.stmts = nil
	s.generation++
}

// setSnapshot begins the statements that import a snapshot: never
// prepared.
const setSnapshot = "SET TRANSACTION SNAPSHOT "

// prepare returns the statement prepared for sql on pc, preparing it (one
// round trip; a prepared statement outlives the transaction it was
// prepared in) when the set does not hold it yet. It returns nil for a
// snapshot's import, when the set is full, and when the statement could
// not be prepared: the caller then runs sql unnamed, and the usual path
// reports any error of its own.
func (s *preparedSet) prepare(ctx context.Context, pc *pgconn.PgConn, m *clientMetrics, sql string) *pgconn.StatementDescription {
	if s == nil {
		return nil
	}
	if sd := s.stmts[sql]; sd != nil {
		return sd
	}
	if strings.HasPrefix(sql, setSnapshot) || len(s.stmts) >= maxPreparedPerConn {
		return nil
	}
	if st := pc.TxStatus(); st != 'I' && st != 'T' { // not in a failed transaction
		return nil
	}
	if err := s.deallocateStale(ctx, pc); err != nil {
		return nil
	}
	digest := sha256.Sum256([]byte(sql))
	name := "larder_" + strconv.Itoa(s.generation) + "_" + hex.EncodeToString(digest[:12])
	sd, err := pc.Prepare(ctx, name, sql, nil)
	if err != nil {
		var perr *pgconn.PrepareError
		if errors.As(err, &perr) && perr.ParseComplete {
			s.stale = append(s.stale, name)
		}
		m.prepared.WithLabelValues("failed").Inc()
		return nil
	}
	if s.stmts == nil {
		s.stmts = map[string]*pgconn.StatementDescription{}
	}
	s.stmts[sql] = sd
	m.prepared.WithLabelValues("prepared").Inc()
	return sd
}

// deallocateStale deallocates the names the set dropped, in one round
// trip.
func (s *preparedSet) deallocateStale(ctx context.Context, pc *pgconn.PgConn) error {
	if len(s.stale) == 0 {
		return nil
	}
	p := pc.StartPipeline(ctx)
	for _, name := range s.stale {
		p.SendDeallocate(name)
	}
	err := p.Sync()
	if cerr := p.Close(); err == nil { // Close reads the answers
		err = cerr
	}
	if err == nil {
		s.stale = nil
	}
	return err
}

// runPrepared runs stmts (no parameters, text results) on conn in one
// round trip, each as a statement the connection keeps prepared when it
// can. A statement PostgreSQL no longer had drops the set; the error is
// returned (stalePrepared tells it), and the caller decides whether to
// run them again.
func runPrepared(ctx context.Context, conn *pgx.Conn, epoch uint64, m *clientMetrics, stmts ...string) ([]*pgconn.Result, error) {
	set := preparedSetOf(conn, epoch, m)
	pc := conn.PgConn()
	b := &pgconn.Batch{}
	for _, s := range stmts {
		if sd := set.prepare(ctx, pc, m, s); sd != nil {
			b.ExecPrepared(sd.Name, nil, nil, nil)
		} else {
			b.ExecParams(s, nil, nil, nil, nil)
		}
	}
	results, err := pc.ExecBatch(ctx, b).ReadAll()
	if stalePrepared(err) {
		set.drop(m)
	}
	return results, err
}

// discardsPrepared matches statements that deallocate every prepared
// statement of the session (a pooler's reset query, say). A match inside
// a literal or a comment only costs the connection its prepared
// statements.
var discardsPrepared = regexp.MustCompile(`(?i)\b(DISCARD\s+ALL|DEALLOCATE\s+(PREPARE\s+)?ALL)\b`)

// forgetPrepared forgets what pc had prepared, pgx's statements and the
// client's, after a statement that deallocated them all
// (discardsPrepared): the next statements are prepared anew instead of
// failing with "prepared statement does not exist".
func forgetPrepared(ctx context.Context, pc *pgx.Conn) error {
	delete(pc.PgConn().CustomData(), preparedSetKey)
	return pc.DeallocateAll(ctx) // resets pgx's caches (the server has none left)
}

// stalePrepared reports whether err says a prepared statement of the
// connection is gone or no longer gives its result type.
func stalePrepared(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "26000" || pgErr.Code == "0A000"
}
