package larder

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

const maxReasons = 100

type clientMetrics struct {
	reads      *prometheus.CounterVec // source: l1, node, database
	uncached   *prometheus.CounterVec // reason
	fallbacks  prometheus.Counter
	nodeErrors prometheus.Counter
	collapsed  prometheus.Counter
	// planRetries: statements run again at the same pin after a schema
	// change made PostgreSQL refuse pgx's cached statement.
	planRetries prometheus.Counter
	// rewrittenRetries: transactions refused because a table they read
	// was truncated or rewritten after their snapshot.
	rewrittenRetries prometheus.Counter
	// sessionsDropped: pooled connections closed because a read/write
	// transaction changed their session state.
	sessionsDropped prometheus.Counter
	// scopeReads: session states read again after a statement that may
	// have changed them (database/sql connections).
	scopeReads prometheus.Counter
	// schemaReloads: the live catalog and the invalidator's coverage read again.
	schemaReloads prometheus.Counter
	mu            sync.Mutex
	seenReasons   map[string]bool
}

func newClientMetrics(reg prometheus.Registerer) *clientMetrics {
	m := &clientMetrics{
		reads:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_reads_total", Help: "Cacheable reads in read-only transactions, by where the result came from (l1, node, database)."}, []string{"source"}),
		uncached:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_uncacheable_total", Help: "Reads that could not be cached, by reason (run at the transaction's snapshot)."}, []string{"reason"}),
		fallbacks:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_fallbacks_total", Help: "Read-only transactions that found no usable pin and ran uncached on a fresh snapshot."}),
		nodeErrors:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_node_errors_total", Help: "Failed cache-node requests (the read went to PostgreSQL)."}),
		collapsed:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_collapsed_misses_total", Help: "Misses that shared a concurrent identical load."}),
		sessionsDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_sessions_dropped_total", Help: "Pooled connections closed because a read/write transaction changed their session state (SET, SET ROLE)."}),
		scopeReads:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_session_state_reads_total", Help: "Reads of a database/sql connection's roles and settings after a statement that may have changed them."}),
		rewrittenRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_rewritten_retries_total", Help: "Read-only transactions refused (ErrRetry) because a table they read was truncated or rewritten after their snapshot; the pins that old are dropped."}),
		planRetries:      prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_plan_retries_total", Help: "Statements run again at the same pin because a schema change replaced a cached statement's result type."}),
		schemaReloads:    prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_schema_reloads_total", Help: "Reloads of the live catalog and of the invalidator's coverage after a schema change."}),
		seenReasons:      map[string]bool{},
	}
	for _, s := range []string{"l1", "node", "database"} {
		m.reads.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.reads, m.uncached, m.fallbacks, m.nodeErrors, m.collapsed, m.sessionsDropped, m.scopeReads, m.schemaReloads, m.planRetries, m.rewrittenRetries)
	}
	return m
}

func (m *clientMetrics) uncacheable(reason string) {
	m.mu.Lock()
	if !m.seenReasons[reason] {
		if len(m.seenReasons) >= maxReasons {
			reason = "other"
		} else {
			m.seenReasons[reason] = true
		}
	}
	m.mu.Unlock()
	m.uncached.WithLabelValues(reason).Inc()
}
