package wan

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/larderdb/larder/internal/servers"
)

// Setting is a link: its bandwidth in each direction and its round trip.
type Setting struct {
	Name string
	// Mbps is the bandwidth of each direction in megabits per second
	// (0: unlimited).
	Mbps float64
	// RTT is the round trip; each direction delays by half of it.
	RTT time.Duration
}

// Settings are the three links: Ganesh's 5 Mb/s with 66 ms, and
// 20 Mb/s with 33 ms, 100 Mb/s with none.
var Settings = []Setting{
	{Name: "5Mbps-66ms", Mbps: 5, RTT: 66 * time.Millisecond},
	{Name: "20Mbps-33ms", Mbps: 20, RTT: 33 * time.Millisecond},
	{Name: "100Mbps-0ms", Mbps: 100, RTT: 0},
}

// ParseSetting reads "5Mbps-66ms"-style names, or one of Settings'.
func ParseSetting(s string) (Setting, error) {
	for _, st := range Settings {
		if st.Name == s {
			return st, nil
		}
	}
	bw, rtt, ok := strings.Cut(s, "Mbps-")
	if !ok {
		return Setting{}, fmt.Errorf("wan: link %q: want like 5Mbps-66ms", s)
	}
	mbps, err := strconv.ParseFloat(bw, 64)
	if err != nil || mbps < 0 {
		return Setting{}, fmt.Errorf("wan: link %q: bandwidth", s)
	}
	d, err := time.ParseDuration(rtt)
	if err != nil || d < 0 {
		return Setting{}, fmt.Errorf("wan: link %q: round trip", s)
	}
	return Setting{Name: s, Mbps: mbps, RTT: d}, nil
}

// pacer is one direction of the link: every connection through any of
// the link's proxies shares its bandwidth (toxiproxy's own bandwidth toxic
// is per connection, which would give a pool of N connections N times
// the link).
type pacer struct {
	mu   sync.Mutex
	free time.Time // when the link finishes sending what it was given
	// nsPerByte is 0 for an unlimited link.
	nsPerByte float64
}

// reserve queues n bytes and returns when their last byte has left.
func (p *pacer) reserve(n int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.free.Before(now) {
		p.free = now
	}
	p.free = p.free.Add(time.Duration(float64(n) * p.nsPerByte))
	return p.free
}

// linkToxic paces a proxy's direction on its link's pacer and counts the
// bytes. Its fields are set once, before any connection goes through.
type linkToxic struct {
	pacer *pacer
	bytes *atomic.Int64
}

func init() { toxics.Register("larder_wan_link", new(linkToxic)) }

// Pipe implements toxics.Toxic.
func (t *linkToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			t.bytes.Add(int64(len(c.Data)))
			if t.pacer.nsPerByte > 0 {
				if d := time.Until(t.pacer.reserve(len(c.Data))); d > 0 {
					timer := time.NewTimer(d)
					select {
					case <-timer.C:
					case <-stub.Interrupt:
						timer.Stop()
						_ = stub.WriteOutput(c, 5*time.Second)
						return
					}
				}
			}
			stub.Output <- c
		}
	}
}

// Link is an emulated WAN: TCP proxies (one per service reached across
// it) sharing one pacer per direction, each with the one-way delay.
type Link struct {
	Setting Setting
	api     *toxiproxy.ApiServer
	up      *pacer // edge → database's site
	down    *pacer // database's site → edge
	mu      sync.Mutex
	proxies []*toxiproxy.Proxy
	bytes   map[string]*[2]atomic.Int64 // by proxy: up, down
}

// NewLink makes an emulated link of s; Proxy adds the services across it.
func NewLink(s Setting) *Link {
	ns := 0.0
	if s.Mbps > 0 {
		ns = 8e3 / s.Mbps // ns per byte: 8 bits / (Mbps * 1e6 bits/s) in ns
	}
	return &Link{Setting: s, api: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		up: &pacer{nsPerByte: ns}, down: &pacer{nsPerByte: ns}, bytes: map[string]*[2]atomic.Int64{}}
}

// Proxy serves a TCP proxy to upstream across the link on a free
// loopback port and returns its address.
func (l *Link) Proxy(name, upstream string) (string, error) {
	port, err := servers.FreePort()
	if err != nil {
		return "", err
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := toxiproxy.NewProxy(l.api, name, listen, upstream)
	counts := &[2]atomic.Int64{}
	for i, dir := range []string{"upstream", "downstream"} {
		pc := l.up
		if i == 1 {
			pc = l.down
		}
		if half := l.Setting.RTT / 2; half > 0 {
			js := fmt.Sprintf(`{"name":"delay_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, dir, dir, half.Milliseconds())
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return "", err
			}
		}
		w, err := p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(`{"name":"link_%s","type":"larder_wan_link","stream":%q}`, dir, dir)))
		if err != nil {
			return "", err
		}
		lt := w.Toxic.(*linkToxic)
		lt.pacer, lt.bytes = pc, &counts[i]
	}
	if err := p.Start(); err != nil {
		return "", err
	}
	l.mu.Lock()
	l.proxies = append(l.proxies, p)
	l.bytes[name] = counts
	l.mu.Unlock()
	return listen, nil
}

// Bytes returns the bytes each proxy carried so far: [0] from the edge,
// [1] to the edge.
func (l *Link) Bytes() map[string][2]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][2]int64{}
	for name, c := range l.bytes {
		out[name] = [2]int64{c[0].Load(), c[1].Load()}
	}
	return out
}

// Close stops every proxy (closing the connections through them).
func (l *Link) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies {
		p.Stop()
	}
	l.proxies = nil
}
