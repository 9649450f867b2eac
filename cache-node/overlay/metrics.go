package overlay

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Request routes, the label route of larder_overlay_requests_total.
const (
	routeLocal     = "local"     // this node is the key's master
	routeForwarded = "forwarded" // sent to the key's master
	routeFromPeer  = "from_peer" // a member forwarded it here
)

// metrics are what the overlay counts.
type metrics struct {
	requests          *prometheus.CounterVec   // op, route
	forwardSeconds    *prometheus.HistogramVec // op
	peerErrors        *prometheus.CounterVec   // op, kind
	refused           *prometheus.CounterVec   // direction
	membershipChanges prometheus.Counter
	peers             prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, routingTableSize func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_overlay_requests_total",
			Help: "Lookups and puts by route: local (this node is the key's master), forwarded (sent to the key's master), from_peer (served for a member that forwarded it).",
		}, []string{"op", "route"}),
		forwardSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "larder_overlay_forward_seconds",
			Help:    "Time of a request forwarded to the key's master, answer included (failures too).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2.5, 12), // 100 µs to ~6 s
		}, []string{"op"}),
		peerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_overlay_peer_errors_total",
			Help: "Requests to a member that failed: kind remote (the member answered with an error), timeout, stream (no stream or a broken one), malformed (an answer that does not decode).",
		}, []string{"op", "kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_overlay_conns_refused_total",
			Help: "Connections refused because the peer is not on the allow-list, by direction (inbound, outbound).",
		}, []string{"direction"}),
		membershipChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "larder_overlay_membership_changes_total",
			Help: "Changes of the set of live members (each moves the keys of the members that joined or left).",
		}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "larder_overlay_peers",
			Help: "Live members other than this node: in the DHT routing table and connected.",
		}),
	}
	rt := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "larder_overlay_routing_table_peers",
		Help: "Peers in the DHT routing table, live or not.",
	}, routingTableSize)
	if reg != nil {
		reg.MustRegister(m.requests, m.forwardSeconds, m.peerErrors, m.refused, m.membershipChanges, m.peers, rt)
	}
	return m
}
