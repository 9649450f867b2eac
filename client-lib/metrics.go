package larder

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/store"
)

const maxReasons = 100

// maxTemplates bounds the template label of larder_client_template_reads_total:
// the first 500 templates a client reads keep their own label, later ones
// share "other" (the cache-node's bound).
const maxTemplates = 500

type clientMetrics struct {
	reads      *prometheus.CounterVec // source: l1, node, database
	uncached   *prometheus.CounterVec // reason
	fallbacks  *prometheus.CounterVec // reason
	nodeErrors prometheus.Counter
	// nodeSkips: reads the L1 missed that did not ask a cache-node.
	nodeSkips prometheus.Counter
	// Per cache-node (label node): the breaker's state (0 closed, 1 open,
	// 2 probing), calls that ran out of time, breakers opened, calls not
	// made while open, probes sent.
	nodeState    *prometheus.GaugeVec
	nodeTimeouts *prometheus.CounterVec
	breakerOpens *prometheus.CounterVec
	nodeBypassed *prometheus.CounterVec
	nodeProbes   *prometheus.CounterVec
	collapsed    prometheus.Counter
	pipedReads   prometheus.Counter
	// parked: pooled read-only transactions left open at their pins
	// (parked.go), by outcome.
	parked *prometheus.CounterVec
	// olderPinBegins: transactions begun at an older candidate pin than
	// the newest, on a transaction parked there (Config.ParkPrefer).
	olderPinBegins prometheus.Counter
	// prepared: statements of pipelined begins prepared on a connection
	// (prepared.go), by outcome: prepared, failed, dropped (a set given up
	// after a schema change or PostgreSQL's refusal).
	prepared *prometheus.CounterVec
	// planRetries: statements run again at the same pin after a schema
	// change made PostgreSQL refuse pgx's cached statement.
	planRetries prometheus.Counter
	// rewrittenRetries: transactions refused because a table they read
	// was truncated or rewritten after their snapshot.
	rewrittenRetries prometheus.Counter
	// storageChecks: tables held, by the check that proved their storage
	// (quick: from an earlier check's fact; full: the catalog join).
	storageChecks *prometheus.CounterVec
	// sessionsDropped: pooled connections closed because a read/write
	// transaction changed their session state.
	sessionsDropped prometheus.Counter
	// closeAbandoned: transactions whose connections Close closed after
	// its timeout.
	closeAbandoned prometheus.Counter
	// scopeReads: session states read again after a statement that may
	// have changed them (database/sql connections).
	scopeReads prometheus.Counter
	// schemaReloads: the live catalog and the invalidator's coverage read again.
	schemaReloads prometheus.Counter
	// registrations: tag column sets asked of the invalidator, by outcome;
	// earlyPuts: results not put on a cache-node because a set they key
	// on took effect after their snapshot.
	registrations *prometheus.CounterVec
	earlyPuts     prometheus.Counter
	// rowSplits: results cached split by rows (quma.RowSplit), by outcome.
	rowSplits *prometheus.CounterVec
	// rowPatches: split results patched from their membership (patch.go),
	// by outcome.
	rowPatches *prometheus.CounterVec
	// functionCalls: cacheable function calls, by outcome (l1, node:
	// hits; run: run and cached; uncacheable: run, not cached).
	functionCalls *prometheus.CounterVec
	// templateReads: reads by query template and source (templateRead).
	templateReads *prometheus.CounterVec
	// templateMisses: larder_client_template_misses_total.
	templateMisses *prometheus.CounterVec
	// pinsOtherServer: pins not imported because the PostgreSQL server
	// that exported them is not the connection's (it restarted since).
	pinsOtherServer prometheus.Counter
	// freshWaits: time to get a fresh snapshot placed, by outcome.
	freshWaits *prometheus.HistogramVec
	// unplacedReads: reads run on PostgreSQL at a fresh snapshot before
	// the pincushion placed it.
	unplacedReads prometheus.Counter

	mu            sync.Mutex
	seenReasons   map[string]bool // guarded by mu
	seenTemplates map[string]bool // guarded by mu
}

func newClientMetrics(reg prometheus.Registerer) *clientMetrics {
	m := &clientMetrics{
		reads:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_reads_total", Help: "Cacheable reads in read-only transactions, by where the result came from (l1, node, database)."}, []string{"source"}),
		uncached:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_uncacheable_total", Help: "Reads that could not be cached, by reason (run at the transaction's snapshot)."}, []string{"reason"}),
		fallbacks:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_fallbacks_total", Help: "Read-only transactions that found no usable pin and ran uncached on a fresh snapshot, by reason: nats (not connected), pins (the pincushion is placing none), verify (it did not place the snapshot in time, or refused it)."}, []string{"reason"}),
		nodeSkips:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_node_lookups_skipped_total", Help: "Reads the L1 missed that did not ask a cache-node: its hit rate after L1 misses was under 5% (one in 16 still asks)."}),
		nodeErrors:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_node_errors_total", Help: "Failed cache-node requests: timeouts and connection errors (the read went to PostgreSQL)."}),
		nodeState:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "larder_client_node_breaker_state", Help: "Each cache-node's circuit breaker: 0 closed (in use), 1 open (bypassed: reads go to PostgreSQL), 2 probing."}, []string{"node"}),
		nodeTimeouts:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_node_timeouts_total", Help: "Cache-node calls that ran out of time (NodeTimeout), connecting included."}, []string{"node"}),
		breakerOpens:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_node_breaker_opens_total", Help: "Times a cache-node's circuit breaker opened after consecutive failures."}, []string{"node"}),
		nodeBypassed:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_node_bypassed_total", Help: "Cache-node calls not made because the node's circuit breaker was open (the read went to PostgreSQL, the put was dropped)."}, []string{"node"}),
		nodeProbes:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_node_probes_total", Help: "Probes of cache-nodes whose circuit breaker was open."}, []string{"node"}),
		collapsed:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_collapsed_misses_total", Help: "Misses that shared a concurrent identical load."}),
		parked:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_parked_transactions_total", Help: "Read-only transactions of the client's pool left open at their pins when they ended (Config.ParkIdle), by outcome: parked, taken (a later transaction at the pin began on it), expired (none came within ParkIdle), evicted (the lot was full), failed (taken, it could not begin the later one, which began anew), closed (the client closed)."}, []string{"outcome"}),
		olderPinBegins:   prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_older_pin_begins_total", Help: "Read-only transactions that began at an older candidate pin than their newest, at most Config.ParkPrefer older, because a transaction was parked there on their connection."}),
		pipedReads:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_piped_reads_total", Help: "Misses read in the same round trip as their transaction's begin (snapshot import, table locks and storage check), or as the locks and storage check of tables their transaction held not yet."}),
		prepared:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_prepared_statements_total", Help: "Statements of pipelined begins (BEGIN, table locks, storage checks, reads) prepared on a connection, by outcome: prepared, failed (run unnamed instead), dropped (given up after a schema change or because PostgreSQL no longer had them)."}, []string{"outcome"}),
		sessionsDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_sessions_dropped_total", Help: "Pooled connections closed because a read/write transaction changed their session state (SET, SET ROLE)."}),
		closeAbandoned:   prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_close_abandoned_transactions_total", Help: "Transactions still open when Close's timeout passed; their connections were closed (PostgreSQL rolled them back)."}),
		scopeReads:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_session_state_reads_total", Help: "Reads of a database/sql connection's roles and settings after a statement that may have changed them."}),
		rewrittenRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_rewritten_retries_total", Help: "Read-only transactions refused (ErrRetry) because a table they read was truncated or rewritten after their snapshot; the pins that old are dropped."}),
		storageChecks:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_storage_checks_total", Help: "Storage checks of the tables read-only transactions hold, by kind: quick (current storage matched an earlier check's fact) or full (the catalog join)."}, []string{"kind"}),
		planRetries:      prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_plan_retries_total", Help: "Statements run again at the same pin because a schema change replaced a cached statement's result type."}),
		schemaReloads:    prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_schema_reloads_total", Help: "Reloads of the live catalog and of the invalidator's coverage after a schema change."}),
		registrations:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_tag_set_registrations_total", Help: "Tag column sets of the QUMA file the client asked the invalidator to publish, by outcome: registered, refused (the invalidator's reason is logged), failed (no answer, or the invalidator could not yet; tried again after a growing pause)."}, []string{"outcome"}),
		rowSplits:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_row_split_results_total", Help: "Cached results whose template splits by rows: split (group tags on the membership columns, a tag per row for the rest) or whole (a NULL key, an unreadable key column, more rows than the split allows)."}, []string{"outcome"}),
		rowPatches:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_row_patches_total", Help: "Reads of a split result that missed it but found its membership (which rows it holds, in order) valid in the L1, by outcome: patched (the rows read again by key at the snapshot and put in order), carried (the same, from a membership of a lower bound, the rows read from the read's bound), repaired (a membership that absorbed changes of named rows: the statement run on its rows and those by key) or refused (the rows read did not match the membership's columns, or one was missing, say left out by a higher bound, or a repaired result could have missed a row past its LIMIT: the query ran)."}, []string{"outcome"}),
		earlyPuts:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_puts_before_tag_set_total", Help: "Results not put on a cache-node because a tag column set they key on was registered after their snapshot (kept in the L1 only)."}),
		functionCalls:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_function_calls_total", Help: "Cacheable function calls, by outcome: l1 and node (hits), run (run and cached), uncacheable (run, not cached: it read something uncacheable)."}, []string{"outcome"}),
		templateReads:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_template_reads_total", Help: "Reads in read-only transactions by query template (its id, the pg_query fingerprint; the first 500 templates, then \"other\") and source: l1 and node (hits), database (a miss, computed at the snapshot and cached), patched (a miss whose rows were read again by key, its membership held: larder_client_row_patches_total), uncached (run at the snapshot, not cached)."}, []string{"template", "source"}),
		templateMisses:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_client_template_misses_total", Help: "Cache lookups that missed, by query template (as larder_client_template_reads_total), cache (l1, node) and class: compulsory (the key held nothing), staleness (only versions older than the transaction may read: invalidated, or older than its staleness limit or its session's last write), capacity (evicted), consistency (a version, but outside the snapshots the transaction can still choose)."}, []string{"template", "cache", "class"}),
		pinsOtherServer:  prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_pins_other_server_total", Help: "Pins not imported because they were exported by another run of the PostgreSQL server than the connection's (it restarted since; snapshot ids repeat across restarts): each is dropped like a released pin and the transaction tries its next one."}),
		freshWaits: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "larder_client_fresh_snapshot_seconds", Help: "Time to place a fresh snapshot, for a read-only transaction that found no pin recent enough (typically its session's first read after a write), each try: BEGIN and the snapshot's read, then the pincushion's answer; by outcome: placed, or not (refused: not exact, or not answered in time). The transaction's reads do not wait for it (larder_client_unplaced_reads_total).",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 12)}, []string{"outcome"}),
		unplacedReads: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_unplaced_reads_total", Help: "Reads run on PostgreSQL, uncached, at a fresh snapshot the pincushion had not placed yet (the read did not wait for it; Config.FreshReadWait)."}),
		seenReasons:   map[string]bool{},
		seenTemplates: map[string]bool{},
	}
	for _, o := range []string{"placed", "not_placed"} {
		m.freshWaits.WithLabelValues(o)
	}
	for _, o := range []string{"l1", "node", "run", "uncacheable"} {
		m.functionCalls.WithLabelValues(o)
	}
	for _, o := range []string{"registered", "refused", "failed"} {
		m.registrations.WithLabelValues(o)
	}
	for _, o := range []string{"patched", "carried", "repaired", "refused"} {
		m.rowPatches.WithLabelValues(o)
	}
	for _, s := range []string{"l1", "node", "database"} {
		m.reads.WithLabelValues(s)
	}
	for _, r := range []string{fallbackNATS, fallbackPins, fallbackVerify} {
		m.fallbacks.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.reads, m.uncached, m.fallbacks, m.nodeErrors, m.nodeSkips, m.collapsed, m.pipedReads, m.parked, m.olderPinBegins, m.prepared, m.sessionsDropped, m.closeAbandoned, m.scopeReads, m.schemaReloads, m.planRetries, m.rewrittenRetries,
			m.storageChecks, m.nodeState, m.nodeTimeouts, m.breakerOpens, m.nodeBypassed, m.nodeProbes, m.registrations, m.earlyPuts, m.rowSplits, m.rowPatches, m.functionCalls, m.templateReads, m.templateMisses,
			m.pinsOtherServer, m.freshWaits, m.unplacedReads)
	}
	return m
}

// Reasons of fallbacks (larder_client_fallbacks_total).
const (
	fallbackNATS   = "nats"
	fallbackPins   = "pins"
	fallbackVerify = "verify"
)

// MetricsRegistry returns a registry holding the metrics a Client
// registers on Config.Metrics, made afresh and tied to no client (every
// value zero): for tools and tests that check what the library exports,
// such as the Grafana dashboard's test in deploy/grafana.
func MetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	newClientMetrics(reg)
	return reg
}

// templateRead counts one read of a query template (quma.Template.ID)
// by where its result came from: "l1" or "node" (hits), "database" (a
// miss, computed at the snapshot and cached), "patched" (a miss whose
// rows were read again by key, patch.go) or "uncached" (run at the
// snapshot without caching). Past maxTemplates distinct templates, new
// ones are counted as "other"; an empty template is not counted.
func (m *clientMetrics) templateRead(template, source string) {
	if template = m.templateLabel(template); template != "" {
		m.templateReads.WithLabelValues(template, source).Inc()
	}
}

// templateMiss counts a lookup of template's result that missed in cache
// (l1 or node), by class.
func (m *clientMetrics) templateMiss(template, cache string, class store.MissClass) {
	if template = m.templateLabel(template); template != "" {
		m.templateMisses.WithLabelValues(template, cache, class.String()).Inc()
	}
}

// templateLabel is template's label: itself, or "other" past the first
// maxTemplates templates ("" for no template).
func (m *clientMetrics) templateLabel(template string) string {
	if template == "" {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.seenTemplates[template] {
		if len(m.seenTemplates) >= maxTemplates {
			return "other"
		}
		m.seenTemplates[template] = true
	}
	return template
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
