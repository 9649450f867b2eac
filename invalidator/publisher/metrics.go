package publisher

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	commits, rows, tags, messages, heartbeats prometheus.Counter
	// nudges: heartbeats emitted early (after a published transaction, or
	// for a client's fresh snapshot) rather than at the interval.
	nudges prometheus.Counter
	// keepaliveHeartbeats: heartbeats published on a walsender keepalive.
	keepaliveHeartbeats             prometheus.Counter
	flushes                         *prometheus.CounterVec
	lagBytes, lagSeconds, confirmed prometheus.Gauge
	publishLatency                  prometheus.Histogram
	slotsCreated                    *prometheus.CounterVec
	slotStatus                      *prometheus.GaugeVec
	slotRetained, slotSafe          prometheus.Gauge
	// oversized: messages too large to publish, replaced by flushes.
	oversized prometheus.Counter
	// identity: covered tables whose replica identity is a problem.
	identity *prometheus.GaugeVec
	// registrations: registrations that added tag column sets;
	// registeredSets: the sets registered at run time, in all.
	registrations  *prometheus.CounterVec
	registeredSets prometheus.Gauge
	// storedSkipped: messages a resumed session did not publish, found
	// stored by an earlier one (stored.go).
	storedSkipped prometheus.Counter
	// derived tag column sets (derived.go): how many, their index loads,
	// and commits that published a set's tag (its index not exact).
	derivedSets    prometheus.Gauge
	derivedLoads   *prometheus.CounterVec
	derivedSetTags prometheus.Counter
}

// slotStatuses are the values of pg_replication_slots.wal_status (and
// "unknown" when it is NULL).
var slotStatuses = []string{"reserved", "extended", "unreserved", "lost", "unknown"}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		commits:             prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_commits_total", Help: "Committed transactions decoded."}),
		rows:                prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_row_changes_total", Help: "Row changes (insert, update, delete) decoded."}),
		tags:                prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_tags_total", Help: "Tag changes published."}),
		messages:            prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_messages_total", Help: "Invalidation messages published to JetStream."}),
		heartbeats:          prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_heartbeats_total", Help: "Heartbeats published."}),
		keepaliveHeartbeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_keepalive_heartbeats_total", Help: "Heartbeats published when a walsender keepalive showed every transaction before a wanted LSN decoded (after a published transaction, or a client's fresh snapshot), without a heartbeat transaction."}),
		nudges:              prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_nudged_heartbeats_total", Help: "Heartbeats written early: after a published transaction, or for a client's fresh snapshot waiting to be placed."}),
		flushes:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_invalidator_flushes_total", Help: "Table flushes published, by reason."}, []string{"reason"}),
		lagBytes:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_replication_lag_bytes", Help: "Server WAL end minus the last heartbeat published."}),
		lagSeconds:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_replication_lag_seconds", Help: "Age of the last transaction published when it was published (0 when caught up)."}),
		confirmed:           prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_confirmed_lsn", Help: "The slot position confirmed to PostgreSQL."}),
		slotsCreated:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_invalidator_slots_created_total", Help: "Replication slots created (each followed by a flush of every table), by reason: missing, lost."}, []string{"reason"}),
		slotStatus:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "larder_invalidator_slot_wal_status", Help: "1 for the replication slot's current wal_status, 0 for the others."}, []string{"status"}),
		slotRetained:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_slot_retained_wal_bytes", Help: "WAL the replication slot retains: current WAL position minus its restart_lsn."}),
		slotSafe:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_slot_safe_wal_bytes", Help: "WAL that can still be written before the replication slot is in danger of being invalidated (safe_wal_size); -1 when unlimited (max_slot_wal_keep_size = -1)."}),
		oversized:           prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_oversized_messages_total", Help: "Invalidation messages too large to publish (a tag holding a very long value), replaced by flushes of their tables."}),
		identity:            prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "larder_invalidator_replica_identity_problems", Help: "Published tables whose replica identity is a problem: no_identity (PostgreSQL refuses their UPDATEs and DELETEs), tag_columns (it lacks tag columns: each change flushes the table)."}, []string{"problem"}),
		registrations:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_invalidator_tag_set_registrations_total", Help: "Tag column sets registered at run time, by outcome: registered (published from the registration's commit LSN, announced by an epoch), not_stored (the KV bucket did not take it: not published)."}, []string{"outcome"}),
		registeredSets:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_registered_tag_sets", Help: "Tag column sets registered at run time and published (kept in the JetStream KV bucket <PREFIX>_TAGSETS)."}),
		derivedSets:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_invalidator_derived_tag_sets", Help: "Derived tag column sets published (a column of the row a foreign key names), each with an index of its two tables."}),
		derivedLoads:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_invalidator_derived_index_loads_total", Help: "Loads of a derived tag column set's index from a snapshot (at a session's start, a registration, after a truncation or schema change of its tables), by outcome: loaded, failed (retried every 10 s; meanwhile every change of its tables publishes the set's tag)."}, []string{"outcome"}),
		derivedSetTags:      prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_derived_set_tags_total", Help: "Commits that published a derived set's own tag, ending every result keyed on the set, because its index could not give their keyed tags exactly (loading, or the commit at or before the snapshot it was read at)."}),
		storedSkipped:       prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_stored_messages_skipped_total", Help: "Messages of commits a session decoded again after a restart and did not publish: it found them in the stream when it read it back at its start."}),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "larder_invalidator_publish_latency_seconds",
			Help:    "Commit (PostgreSQL's commit time) to hand-off to NATS.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	for _, r := range []string{"truncate", "schema", "ddl", "slot", "large_transaction", "oversized"} {
		m.flushes.WithLabelValues(r)
	}
	for _, r := range []string{"no_identity", "tag_columns"} {
		m.identity.WithLabelValues(r)
	}
	for _, r := range []string{"missing", "lost"} {
		m.slotsCreated.WithLabelValues(r)
	}
	for _, o := range []string{"registered", "not_stored"} {
		m.registrations.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.commits, m.rows, m.tags, m.messages, m.heartbeats, m.nudges, m.keepaliveHeartbeats, m.flushes, m.lagBytes, m.lagSeconds, m.confirmed, m.publishLatency,
			m.slotsCreated, m.slotStatus, m.slotRetained, m.slotSafe, m.oversized, m.identity, m.registrations, m.registeredSets, m.storedSkipped,
			m.derivedSets, m.derivedLoads, m.derivedSetTags)
	}
	return m
}
