package larder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"

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
// pin would take a statement of its own.

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

// preparedSetOf returns pc's set at epoch (a set of an older epoch is
// dropped).
func preparedSetOf(pc *pgconn.PgConn, epoch uint64, m *clientMetrics) *preparedSet {
	data := pc.CustomData()
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
	m.prepared.WithLabelValues("dropped").Add(float64(len(s.stmts)))
	for _, sd := range s.stmts {
		s.stale = append(s.stale, sd.Name)
	}
	s.stmts = nil
	s.generation++
}

// prepare returns the statement prepared for sql on pc, preparing it
// (one round trip, outside any transaction) when the set does not hold it
// yet. It returns nil when the set is full or the statement could not be
// prepared: the caller then runs sql unnamed, and the usual path reports
// any error of its own.
func (s *preparedSet) prepare(ctx context.Context, pc *pgconn.PgConn, m *clientMetrics, sql string) *pgconn.StatementDescription {
	if sd := s.stmts[sql]; sd != nil {
		return sd
	}
	if len(s.stmts) >= maxPreparedPerConn || pc.TxStatus() != 'I' {
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

// stalePrepared reports whether err says a prepared statement of the
// connection is gone or no longer gives its result type.
func stalePrepared(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "26000" || pgErr.Code == "0A000"
}
