package explain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Components that export the metrics Scrape reads.
const (
	ComponentNode   = "cache-node"
	ComponentClient = "client" // an application linking client-lib
)

// The metrics Scrape reads.
const (
	metricClientTemplateReads  = "larder_client_template_reads_total"
	metricClientTemplateMisses = "larder_client_template_misses_total"
	metricNodeTemplateLookups  = "larder_node_template_lookups_total"
	metricNodeTemplatePuts     = "larder_node_template_puts_total"
	metricNodeTemplatePutBytes = "larder_node_template_put_bytes_total"
	metricNodeBytes            = "larder_node_bytes"
	metricNodeInvalidations    = "larder_node_invalidations_applied_total"
)

// Metric is a metric Scrape reads and the component that exports it.
type Metric struct {
	Name      string
	Component string
}

// Metrics lists the metrics Scrape reads, each with the component that
// exports it (deploy/grafana's test checks that they do).
func Metrics() []Metric {
	return []Metric{
		{metricClientTemplateReads, ComponentClient},
		{metricClientTemplateMisses, ComponentClient},
		{metricNodeTemplateLookups, ComponentNode},
		{metricNodeTemplatePuts, ComponentNode},
		{metricNodeTemplatePutBytes, ComponentNode},
		{metricNodeBytes, ComponentNode},
		{metricNodeInvalidations, ComponentNode},
	}
}

// otherTemplate is the label both the node and the client give templates
// past their first 500.
const otherTemplate = "other"

// maxScrapeBytes bounds one endpoint's answer: a cache-node with 500
// templates exports a few hundred kilobytes.
const maxScrapeBytes = 64 << 20

// Live holds the figures of one template, added up over the endpoints.
type Live struct {
	Endpoints []Endpoint `json:"endpoints"`
	// Client is nil when no endpoint exports client-lib's metrics; Node,
	// when none exports a cache-node's.
	Client *ClientFigures `json:"client,omitempty"`
	Node   *NodeFigures   `json:"node,omitempty"`
}

// Endpoint is one metrics endpoint and what it exports.
type Endpoint struct {
	URL string `json:"url"`
	// Exports lists the components whose metrics it serves: cache-node,
	// client, invalidator, front.
	Exports []string `json:"exports,omitempty"`
	// Error says why it could not be read ("" when it was).
	Error string `json:"error,omitempty"`
}

// ClientFigures are the template's reads in read-only transactions.
type ClientFigures struct {
	// Calls are all reads; BySource splits them: l1 and node (hits),
	// database (a miss, computed and cached), uncached.
	Calls    float64            `json:"calls"`
	BySource map[string]float64 `json:"by_source"`
	// HitRate is (l1 + node) / Calls; nil without calls.
	HitRate *float64 `json:"hit_rate,omitempty"`
	// L1Misses are the lookups that missed the clients' L1s, by class
	// (compulsory, staleness, capacity, consistency); empty when no
	// client has an L1 or none missed.
	L1Misses map[string]float64 `json:"l1_misses,omitempty"`
	// MaybeOther says the template has no series of its own while some
	// client labels templates "other": it may be counted there.
	MaybeOther bool `json:"maybe_other,omitempty"`
}

// NodeFigures are the template's lookups and puts on the cache-nodes.
type NodeFigures struct {
	Lookups float64 `json:"lookups"`
	Hits    float64 `json:"hits"`
	// HitRate is Hits / Lookups; nil without lookups.
	HitRate *float64 `json:"hit_rate,omitempty"`
	// Misses by class: compulsory, staleness, capacity, consistency.
	Misses   map[string]float64 `json:"misses"`
	Puts     float64            `json:"puts"`
	BytesPut float64            `json:"bytes_put"`
	// BytesHeldApprox is, summed over the nodes, the template's share of
	// the node's bytes put times the bytes it holds; nil when no node
	// reports both.
	BytesHeldApprox *float64 `json:"bytes_held_approx,omitempty"`
	// InvalidationsApplied counts the invalidation messages the nodes
	// applied, for every template: they are not attributed to templates.
	InvalidationsApplied float64 `json:"invalidations_applied_all_templates"`
	MaybeOther           bool    `json:"maybe_other,omitempty"`
}

// Miss classes in the order reports list them.
var missClasses = []string{"compulsory", "staleness", "capacity", "consistency"}

// Scrape reads every endpoint (Prometheus text format) with hc (nil:
// http.DefaultClient) and adds up the figures of template. An endpoint
// that cannot be read is listed with its error; Failed counts them.
func Scrape(ctx context.Context, hc *http.Client, urls []string, template string) *Live {
	if hc == nil {
		hc = http.DefaultClient
	}
	live := &Live{Endpoints: []Endpoint{}}
	var client *ClientFigures
	var node *NodeFigures
	for _, raw := range urls {
		u := EndpointURL(raw)
		ep := Endpoint{URL: u}
		fams, err := fetch(ctx, hc, u)
		if err != nil {
			ep.Error = err.Error()
			live.Endpoints = append(live.Endpoints, ep)
			continue
		}
		ep.Exports = exports(fams)
		live.Endpoints = append(live.Endpoints, ep)
		for _, c := range ep.Exports {
			switch c {
			case ComponentClient:
				if client == nil {
					client = &ClientFigures{BySource: map[string]float64{}, L1Misses: map[string]float64{}}
				}
				addClient(client, fams, template)
			case ComponentNode:
				if node == nil {
					node = &NodeFigures{Misses: map[string]float64{}}
					for _, c := range missClasses {
						node.Misses[c] = 0
					}
				}
				addNode(node, fams, template)
			}
		}
	}
	if client != nil {
		if client.Calls > 0 {
			rate := (client.BySource["l1"] + client.BySource["node"]) / client.Calls
			client.HitRate = &rate
		}
		client.MaybeOther = client.MaybeOther && client.Calls == 0
		live.Client = client
	}
	if node != nil {
		if node.Lookups > 0 {
			rate := node.Hits / node.Lookups
			node.HitRate = &rate
		}
		node.MaybeOther = node.MaybeOther && node.Lookups == 0 && node.Puts == 0
		live.Node = node
	}
	return live
}

// Failed counts the endpoints that could not be read.
func (l *Live) Failed() int {
	n := 0
	for _, ep := range l.Endpoints {
		if ep.Error != "" {
			n++
		}
	}
	return n
}

// EndpointURL completes an endpoint as given on a command line:
// "host:port" is http://host:port/metrics, and a URL without a path gets
// /metrics.
func EndpointURL(s string) string {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return s // fetch reports it
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String()
}

// fetch reads one endpoint's metric families.
func fetch(ctx context.Context, hc *http.Client, u string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("unreachable: %w", err)
	}
	// The text format: what every Prometheus client library serves.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("unreachable: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered %s", resp.Status)
	}
	// Anything but a web page or the protobuf format is tried as text
	// (a file server says application/octet-stream).
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err == nil && (mt == "text/html" || strings.Contains(mt, "protobuf")) {
		return nil, fmt.Errorf("answered %s, not the Prometheus text format", mt)
	}
	body := io.LimitReader(resp.Body, maxScrapeBytes+1)
	lr := &countingReader{r: body}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(lr)
	if lr.n > maxScrapeBytes {
		return nil, fmt.Errorf("answered more than %d MiB", maxScrapeBytes>>20)
	}
	if err != nil {
		return nil, fmt.Errorf("not the Prometheus text format: %w", err)
	}
	if len(fams) == 0 {
		return nil, errors.New("exports no metrics")
	}
	return fams, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// exports names the components whose metrics fams hold.
func exports(fams map[string]*dto.MetricFamily) []string {
	has := map[string]bool{}
	for name := range fams {
		switch {
		case strings.HasPrefix(name, "larder_node_"):
			has[ComponentNode] = true
		case strings.HasPrefix(name, "larder_client_"):
			has[ComponentClient] = true
		case strings.HasPrefix(name, "larder_invalidator_"), strings.HasPrefix(name, "larder_pincushion_"):
			has["invalidator"] = true
		case strings.HasPrefix(name, "larder_front_"):
			has["front"] = true
		}
	}
	var out []string
	for _, c := range []string{ComponentNode, ComponentClient, "invalidator", "front"} {
		if has[c] {
			out = append(out, c)
		}
	}
	return out
}

func addClient(f *ClientFigures, fams map[string]*dto.MetricFamily, template string) {
	for _, m := range fams[metricClientTemplateReads].GetMetric() {
		switch label(m, "template") {
		case template:
			v := value(m)
			f.Calls += v
			f.BySource[label(m, "source")] += v
		case otherTemplate:
			f.MaybeOther = true
		}
	}
	for _, m := range fams[metricClientTemplateMisses].GetMetric() {
		if label(m, "template") == template && label(m, "cache") == "l1" {
			f.L1Misses[label(m, "class")] += value(m)
		}
	}
}

func addNode(f *NodeFigures, fams map[string]*dto.MetricFamily, template string) {
	for _, m := range fams[metricNodeTemplateLookups].GetMetric() {
		switch label(m, "template") {
		case template:
			v := value(m)
			f.Lookups += v
			if r := label(m, "result"); r == "hit" {
				f.Hits += v
			} else {
				f.Misses[r] += v
			}
		case otherTemplate:
			f.MaybeOther = true
		}
	}
	for _, m := range fams[metricNodeTemplatePuts].GetMetric() {
		if label(m, "template") == template {
			f.Puts += value(m)
		}
	}
	var mine, all float64
	for _, m := range fams[metricNodeTemplatePutBytes].GetMetric() {
		v := value(m)
		all += v
		if label(m, "template") == template {
			mine += v
		}
	}
	f.BytesPut += mine
	if held := fams[metricNodeBytes].GetMetric(); all > 0 && len(held) > 0 {
		est := mine / all * value(held[0])
		if f.BytesHeldApprox != nil {
			est += *f.BytesHeldApprox
		}
		f.BytesHeldApprox = &est
	}
	for _, m := range fams[metricNodeInvalidations].GetMetric() {
		f.InvalidationsApplied += value(m)
	}
}

// label returns the value of m's label name ("" when it has none).
func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// value returns a counter's, gauge's or untyped sample's value.
func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}
