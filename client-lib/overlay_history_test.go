package larder

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/overlay"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// overlayRun: three cache-nodes in a libp2p overlay (pre-shared key and
// allow-list), the client with the home placement over them, so that
// every request reaches the first node and is forwarded to its key's
// master. A quarter into the run the home node is killed (its NATS
// connection and its overlay go first): the others see it leave, its
// keys move to them, and the client's breaker makes the second node home;
// at half the run a fourth node joins and masters its share of the keys
// from then on, empty; at three quarters the killed node comes back on
// its address and identity, empty, and becomes home again once the
// client's probe finds it. Every move makes a node master keys it holds
// nothing of, and leaves versions on nodes that no longer master them,
// still following their groups. After the run the test requires that
// requests were forwarded, that members served them, and that the second
// node served the client while the home node was down.
func overlayRun(t *testing.T) historyRun {
	cl := &overlayCluster{}
	return historyRun{
		client: func(t *testing.T, s *stack, l1 int64) *Client {
			cl.setUp(t, s, 4)
			for i := range 3 {
				cl.start(t, i)
			}
			cl.waitMembers(t, 0, 1, 2)
			return s.openWith(t, cl.addrs[:3], l1, true, func(c *Config) { c.Placement = HomePlacement() })
		},
		faults: func(ctx context.Context, t *testing.T, s *stack, run time.Duration) {
			steps := []func(){
				func() {
					t.Logf("fault: the home cache-node is killed at WAL %s", walNow(t, s))
					cl.kill(0)
				},
				func() {
					t.Logf("fault: a fourth cache-node joins at WAL %s", walNow(t, s))
					cl.start(t, 3)
				},
				func() {
					t.Logf("fault: the home cache-node comes back, empty, at WAL %s", walNow(t, s))
					cl.start(t, 0)
				},
			}
			faultTimes(ctx, run, len(steps), func(i int) { steps[i]() })
			<-ctx.Done()
			c := cl.counts()
			t.Logf("overlay requests by node (local/forwarded/from_peer): %v", c)
			forwarded, fromPeer := 0.0, 0.0
			for _, n := range c {
				forwarded += n["forwarded"]
				fromPeer += n["from_peer"]
			}
			if forwarded == 0 || fromPeer == 0 {
				t.Errorf("%v requests forwarded, %v served for a member: the run did not exercise forwarding", forwarded, fromPeer)
			}
			if c[1]["local"]+c[1]["forwarded"] == 0 {
				t.Error("the second node served no client request while the home node was down: the home did not fail over")
			}
		},
	}
}

// overlayCluster runs cache-nodes of one overlay in the test's process.
type overlayCluster struct {
	s     *stack
	psk   pnet.PSK
	keys  []string
	allow []peer.ID
	addrs []string // protocol addresses, kept across restarts

	mu    sync.Mutex
	nodes []*overlayNode       // by index; nil when down
	total []map[string]float64 // requests by route, of the nodes stopped
}

type overlayNode struct {
	ov   *overlay.Overlay
	reg  *prometheus.Registry
	kill func()
}

// setUp makes the overlay's pre-shared key and n identities, all on the
// allow-list, and reserves n protocol addresses.
func (cl *overlayCluster) setUp(t *testing.T, s *stack, n int) {
	cl.s = s
	dir := t.TempDir()
	var err error
	if cl.psk, err = overlay.WritePSK(filepath.Join(dir, "swarm.key")); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := filepath.Join(dir, fmt.Sprintf("node%d.key", i))
		k, err := overlay.LoadOrCreateIdentity(key)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl.addrs = append(cl.addrs, ln.Addr().String())
		ln.Close()
		cl.keys, cl.allow = append(cl.keys, key), append(cl.allow, id)
	}
	cl.nodes = make([]*overlayNode, n)
	cl.total = make([]map[string]float64, n)
	for i := range cl.total {
		cl.total[i] = map[string]float64{}
	}
	t.Cleanup(func() {
		for i := range cl.nodes {
			cl.kill(i)
		}
	})
}

// start runs node i (memory store) on its address, joining through the
// nodes that run.
func (cl *overlayCluster) start(t *testing.T, i int) {
	cl.mu.Lock()
	var boot []peer.AddrInfo
	for _, n := range cl.nodes {
		if n != nil {
			boot = append(boot, peer.AddrInfo{ID: n.ov.ID(), Addrs: n.ov.Host().Addrs()})
		}
	}
	cl.mu.Unlock()
	nc, err := nats.Connect(cl.s.nats, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Errorf("cache-node %d: %v", i, err)
		return
	}
	var n *node.Node
	backend := store.NewMemory(64<<20, func(names []string) { n.OnRelease(names) })
	reg := prometheus.NewRegistry()
	if n, err = node.New(node.Config{NATS: nc, Prefix: cl.s.prefix, Backend: backend, Log: quiet, Metrics: reg}); err != nil {
		t.Errorf("cache-node %d: %v", i, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ov, err := overlay.Start(ctx, overlay.Config{Listen: []string{"127.0.0.1:0"}, KeyFile: cl.keys[i], PSK: cl.psk, Allow: cl.allow,
		Bootstrap: boot, Handler: n.Handler(), Registry: reg, Log: quiet})
	if err != nil {
		cancel()
		t.Errorf("cache-node %d: overlay: %v", i, err)
		return
	}
	ln, err := net.Listen("tcp", cl.addrs[i])
	if err != nil {
		cancel()
		ov.Close()
		t.Errorf("cache-node %d: %v", i, err)
		return
	}
	nodeDone, srvDone := make(chan error, 1), make(chan error, 1)
	go func() { nodeDone <- n.Run(ctx) }()
	srv := &protocol.Server{Handler: ov.Handler(), Log: quiet}
	go func() { srvDone <- srv.Serve(ctx, ln) }()
	var once sync.Once
	on := &overlayNode{ov: ov, reg: reg}
	// A kill: nothing of a graceful shutdown reaches NATS or the members.
	on.kill = func() {
		once.Do(func() {
			nc.Close()
			_ = ov.Close()
			cancel()
			_ = ln.Close()
			<-nodeDone
			<-srvDone
			_ = backend.Close()
		})
	}
	cl.mu.Lock()
	cl.nodes[i] = on
	cl.mu.Unlock()
}

// kill stops node i, keeping what it counted.
func (cl *overlayCluster) kill(i int) {
	cl.mu.Lock()
	n := cl.nodes[i]
	cl.nodes[i] = nil
	if n != nil {
		for route, v := range routes(n.reg) {
			cl.total[i][route] += v
		}
	}
	cl.mu.Unlock()
	if n != nil {
		n.kill()
	}
}

// waitMembers waits until each of the nodes sees all of them.
func (cl *overlayCluster) waitMembers(t *testing.T, idx ...int) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok := true
		cl.mu.Lock()
		for _, i := range idx {
			if n := cl.nodes[i]; n == nil || len(n.ov.Members()) < len(idx) {
				ok = false
			}
		}
		cl.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache-nodes %v did not all see each other within 30 s", idx)
		}
	}
}

// counts are each node's overlay requests by route, over its restarts.
func (cl *overlayCluster) counts() []map[string]float64 {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make([]map[string]float64, len(cl.nodes))
	for i, n := range cl.nodes {
		out[i] = map[string]float64{}
		for route, v := range cl.total[i] {
			out[i][route] = v
		}
		if n != nil {
			for route, v := range routes(n.reg) {
				out[i][route] += v
			}
		}
	}
	return out
}

// routes sums larder_overlay_requests_total by route.
func routes(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, f := range families {
		if f.GetName() != "larder_overlay_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
