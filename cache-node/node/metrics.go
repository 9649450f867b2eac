package node

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/store"
)

// maxTemplates bounds the template label's values: the first 500
// templates a node sees (in lookups or puts) keep their own label, later
// ones share "other".
const maxTemplates = 500

type metrics struct {
	lookups       *prometheus.CounterVec // result: hit or the miss class
	byTemplate    *prometheus.CounterVec // template, result
	puts          prometheus.Counter
	invalidations prometheus.Counter
	corrupt       prometheus.Counter
	gaps          *prometheus.CounterVec
	errors        *prometheus.CounterVec
	groups        prometheus.Gauge
	replays       *prometheus.CounterVec
	leases        *prometheus.CounterVec // result
	received      *prometheus.CounterVec // kind
	// watermarkWaits counts lookups that waited for the watermark
	// (wmwait.go), by outcome.
	watermarkWaits *prometheus.CounterVec

	// templatePuts and templatePutBytes count puts and their bytes (as
	// the byte budget counts them) by template. Bytes held are not
	// tracked per template: the backends evict and settle versions
	// without knowing templates. A template's share of the bytes put
	// times larder_node_bytes approximates what it holds.
	templatePuts, templatePutBytes *prometheus.CounterVec // template

	mu        sync.Mutex
	templates map[string]bool
}

func newMetrics(reg prometheus.Registerer, n *Node) *metrics {
	m := &metrics{
		lookups:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_lookups_total", Help: "Lookups by result: hit, or the miss class (compulsory, staleness, capacity, consistency)."}, []string{"result"}),
		byTemplate:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_template_lookups_total", Help: "Lookups by query template and result (the first 500 templates; then \"other\")."}, []string{"template", "result"}),
		puts:           prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_node_puts_total", Help: "Versions put."}),
		invalidations:  prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_node_invalidations_applied_total", Help: "Invalidation messages applied."}),
		corrupt:        prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_node_corrupt_messages_total", Help: "Invalidation messages that did not decode (each is handled as a gap)."}),
		gaps:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_stream_gaps_total", Help: "Possible gaps in the invalidation stream: open versions ended at the watermark."}, []string{"why"}),
		errors:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_errors_total", Help: "Backend or JetStream errors by operation."}, []string{"op"}),
		groups:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "larder_node_subscriptions", Help: "NATS groups (tags and table flushes) the node follows."}),
		replays:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_replays_total", Help: "JetStream replays after a reconnect, by outcome (started, done, failed)."}, []string{"result"}),
		leases:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_load_leases_total", Help: "Load leases of lookups that missed asking to wait: granted (the requester loads), hit_after_wait and miss_after_wait (a requester that waited for another's load, by what it then found)."}, []string{"result"}),
		received:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_invalidation_messages_received_total", Help: "Invalidation messages delivered to the node (heartbeats not counted), by kind: applied (of a group the node follows), ignored (of none: broadcast mode, a group left since, a subject shared by another name)."}, []string{"kind"}),
		templates:      map[string]bool{},
		watermarkWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_watermark_waits_total", Help: "Lookups whose range began beyond the watermark, for a key holding a version that would then serve them, that waited for a heartbeat, by outcome: reached (looked up again), timed_out (answered the miss)."}, []string{"result"}),
	}
	m.templatePuts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_template_puts_total",
		Help: "Versions put by query template (the first 500 templates; then \"other\")."}, []string{"template"})
	m.templatePutBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "larder_node_template_put_bytes_total",
		Help: "Bytes of the versions put by query template, as the byte budget counts them (the first 500 templates; then \"other\"). Not bytes held: a template's share of these times larder_node_bytes approximates those."}, []string{"template"})
	for _, c := range []store.MissClass{store.Hit, store.MissCompulsory, store.MissStaleness, store.MissCapacity, store.MissConsistency} {
		m.lookups.WithLabelValues(c.String())
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.lookups, m.byTemplate, m.puts, m.templatePuts, m.templatePutBytes, m.invalidations, m.corrupt, m.gaps, m.errors, m.groups, m.replays, m.leases, m.received, m.watermarkWaits)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "larder_node_watermark_lsn", Help: "LSN up to which the node knows every invalidation of its groups."},
		func() float64 { return float64(n.Watermark()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "larder_node_watermark_lag_seconds", Help: "Age of the last heartbeat (the invalidator's clock)."},
		func() float64 {
			n.mu.Lock()
			t := n.hbTime
			n.mu.Unlock()
			if t.IsZero() {
				return -1
			}
			return time.Since(t).Seconds()
		}))
	reg.MustRegister(&backendCollector{b: n.cfg.Backend})
	return m
}

func (m *metrics) lookup(c store.MissClass, template string) {
	m.lookups.WithLabelValues(c.String()).Inc()
	if template == "" {
		return
	}
	m.byTemplate.WithLabelValues(m.templateLabel(template), c.String()).Inc()
}

// put counts a version of size bytes put for template ("" for none).
func (m *metrics) put(template string, size int64) {
	m.puts.Inc()
	if template == "" {
		return
	}
	label := m.templateLabel(template)
	m.templatePuts.WithLabelValues(label).Inc()
	m.templatePutBytes.WithLabelValues(label).Add(float64(size))
}

// templateLabel returns the template label for template: itself for the
// first maxTemplates templates seen, "other" for later ones.
func (m *metrics) templateLabel(template string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.templates[template] {
		if len(m.templates) >= maxTemplates {
			return "other"
		}
		m.templates[template] = true
	}
	return template
}

// backendCollector reports the backend's own counters at scrape time.
type backendCollector struct{ b store.Backend }

var (
	descKeys      = prometheus.NewDesc("larder_node_keys", "Keys held.", nil, nil)
	descVersions  = prometheus.NewDesc("larder_node_versions", "Versions (entries) held.", nil, nil)
	descBytes     = prometheus.NewDesc("larder_node_bytes", "Bytes held, as the backend counts them.", nil, nil)
	descBudget    = prometheus.NewDesc("larder_node_budget_bytes", "The byte budget.", nil, nil)
	descEvictions = prometheus.NewDesc("larder_node_evictions_total", "Versions evicted for space.", nil, nil)
)

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeys
	ch <- descVersions
	ch <- descBytes
	ch <- descBudget
	ch <- descEvictions
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.b.Stats(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(descVersions, prometheus.GaugeValue, float64(st.Versions))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(st.Budget))
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(st.Evictions))
}
