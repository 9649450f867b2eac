package pgfront

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats counts what a Front did. Safe for concurrent use.
type Stats struct {
	// Sessions counts client sessions that reached PostgreSQL's
	// ReadyForQuery (authenticated); Open is how many are open.
	Sessions, Open atomic.Int64
	// Relayed counts statements (a simple query, an Execute, a function
	// call) passed to PostgreSQL unchanged; Served, statements of Larder
	// transactions the front answered through the library.
	Relayed, Served atomic.Int64
	// Of Served: Hits came from the L1 or a cache-node, Misses from
	// PostgreSQL at the transaction's snapshot and now cached, Uncached
	// from PostgreSQL at the snapshot without caching.
	Hits, Misses, Uncached atomic.Int64
	// Transactions counts Larder read-only transactions begun; Retries,
	// those that ended with 40001 (the client runs them again).
	Transactions, Retries atomic.Int64
	// Refused counts statements and messages refused with an error the
	// front made (and sessions it ended on malformed input).
	Refused atomic.Int64
}

// frontMetrics are the front's Prometheus metrics (larder_front_*).
type frontMetrics struct {
	sessions     prometheus.Counter
	open         prometheus.Gauge
	statements   *prometheus.CounterVec // path: relayed, larder
	reads        *prometheus.CounterVec // source: l1, node, database, uncached
	transactions prometheus.Counter
	retries      prometheus.Counter
	refused      *prometheus.CounterVec // reason
	startups     *prometheus.CounterVec // outcome: ok, auth, refused, error
}

// Reasons of larder_front_refused_total.
const (
	refusedProtocol    = "protocol"     // malformed or unexpected protocol input
	refusedStatement   = "statement"    // a statement a Larder transaction does not run
	refusedStaleness   = "staleness"    // a bad larder.staleness
	refusedPipeline    = "pipeline"     // a Larder statement the front could not order in a pipeline
	refusedReplication = "replication"  // a replication connection
	refusedTLS         = "tls"          // TLS asked for but not configured, or failed
	refusedCancel      = "cancel"       // a cancel request for no session of this front
	refusedUnsupported = "unsupported"  // a protocol feature the front does not relay (GSS)
	refusedFailedTx    = "failed_tx"    // a statement after an error in a Larder transaction
	refusedDescription = "descriptions" // a statement PostgreSQL could not describe
)

func newFrontMetrics(reg prometheus.Registerer) *frontMetrics {
	m := &frontMetrics{
		sessions:     prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_front_sessions_total", Help: "Client sessions that authenticated with PostgreSQL through the front."}),
		open:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_front_sessions_open", Help: "Client sessions open."}),
		statements:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_front_statements_total", Help: "Statements by path: relayed (passed to PostgreSQL unchanged) or larder (answered through the library in a Larder read-only transaction)."}, []string{"path"}),
		reads:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_front_reads_total", Help: "Statements of Larder transactions by where their answer came from: l1 and node are hits, database a miss (now cached), uncached a read at the snapshot that is not cached."}, []string{"source"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_front_transactions_total", Help: "Larder read-only transactions begun (BEGIN READ ONLY through the front)."}),
		retries:      prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_front_retries_total", Help: "Larder transactions ended with SQLSTATE 40001: no snapshot consistent with their reads was left; the client retries them."}),
		refused:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_front_refused_total", Help: "Input the front refused with an error of its own, by reason."}, []string{"reason"}),
		startups:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_front_startups_total", Help: "Session start-ups by outcome: ok, auth (PostgreSQL refused the credentials or the database), refused (by the front), error (network, PostgreSQL down)."}, []string{"outcome"}),
	}
	for _, p := range []string{"relayed", "larder"} {
		m.statements.WithLabelValues(p)
	}
	for _, s := range []string{"l1", "node", "database", "uncached"} {
		m.reads.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.sessions, m.open, m.statements, m.reads, m.transactions, m.retries, m.refused, m.startups)
	}
	return m
}
