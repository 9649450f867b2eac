package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kbucket "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// convergence is how long a test waits for members to see each other: far
// more than they need on an idle machine.
const convergence = 60 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recordingHandler is a node's store as far as the overlay sees it: puts
// are kept by key, and a lookup answers the value put, prefixed with the
// handler's name, so a test sees which node answered.
type recordingHandler struct {
	name    string
	mu      sync.Mutex
	puts    map[string][]byte
	lookups atomic.Int64
	hang    bool // lookups wait for the end of their context
}

func newRecordingHandler(name string) *recordingHandler {
	return &recordingHandler{name: name, puts: map[string][]byte{}}
}

func (h *recordingHandler) Lookup(ctx context.Context, q protocol.LookupRequest) (protocol.LookupResponse, error) {
	h.lookups.Add(1)
	if h.hang {
		<-ctx.Done()
		return store.Result{}, ctx.Err()
	}
	if string(q.Key) == "refused" {
		return store.Result{}, errors.New("no such luck")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.puts[string(q.Key)]
	if !ok {
		return store.Result{Miss: store.MissCompulsory}, nil
	}
	return store.Result{Miss: store.Hit, Lo: q.TMin, Hi: q.TMax + 1, Snapshot: q.TMin, Value: []byte(h.name + ":" + string(v))}, nil
}

func (h *recordingHandler) Put(_ context.Context, p protocol.PutRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.puts[string(p.Key)] = append([]byte(nil), p.Value...)
	return nil
}

func (h *recordingHandler) Stats(context.Context) (protocol.StatsResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return protocol.StatsResponse{Watermark: 7, Keys: int64(len(h.puts))}, nil
}

func (h *recordingHandler) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.puts[key]
	return ok
}

// cluster is the credentials of a test overlay: a pre-shared key and the
// identities of its members, all on the allow-list.
type cluster struct {
	dir      string
	psk      pnet.PSK
	keyFiles []string
	ids      []peer.ID
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c := &cluster{dir: t.TempDir()}
	var err error
	if c.psk, err = WritePSK(filepath.Join(c.dir, "swarm.key")); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.addIdentity(t, fmt.Sprintf("node%d.key", i))
	}
	return c
}

// addIdentity makes an identity key file and returns its index.
func (c *cluster) addIdentity(t testing.TB, name string) int {
	t.Helper()
	path := filepath.Join(c.dir, name)
	k, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	c.keyFiles, c.ids = append(c.keyFiles, path), append(c.ids, id)
	return len(c.ids) - 1
}

// config is member i's configuration, joining through boot.
func (c *cluster) config(i int, h protocol.Handler, boot *Overlay) Config {
	cfg := Config{
		Listen:           []string{"/ip4/127.0.0.1/tcp/0"},
		KeyFile:          c.keyFiles[i],
		PSK:              c.psk,
		Allow:            c.ids,
		Handler:          h,
		Registry:         prometheus.NewRegistry(),
		Log:              quiet,
		LivenessInterval: 200 * time.Millisecond,
	}
	if boot != nil {
		cfg.Bootstrap = []peer.AddrInfo{{ID: boot.ID(), Addrs: boot.Host().Addrs()}}
	}
	return cfg
}

func start(t *testing.T, cfg Config) *Overlay {
	t.Helper()
	o, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

// startCluster starts members 0..n-1 of c, each joining through member 0.
func startCluster(t *testing.T, c *cluster, n int) ([]*Overlay, []*recordingHandler) {
	t.Helper()
	var ovs []*Overlay
	var hs []*recordingHandler
	for i := range n {
		h := newRecordingHandler(fmt.Sprintf("node%d", i))
		var boot *Overlay
		if i > 0 {
			boot = ovs[0]
		}
		ovs, hs = append(ovs, start(t, c.config(i, h, boot))), append(hs, h)
	}
	return ovs, hs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(convergence)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", convergence, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMembers waits until every overlay sees exactly want as its members.
func waitMembers(t *testing.T, ovs []*Overlay, want []peer.ID) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	waitFor(t, fmt.Sprintf("every member sees %d members", len(want)), func() bool {
		for _, o := range ovs {
			if !slices.Equal(o.Members(), want) {
				return false
			}
		}
		return true
	})
}

func testKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%d", i))
	}
	return keys
}

// closest is the member standing at the point closest to key, every
// member at DefaultVirtualPositions points, by kbucket's own distance.
func closest(members []peer.ID, key []byte) peer.ID {
	return closestAt(members, key, DefaultVirtualPositions)
}

func closestAt(members []peer.ID, key []byte, positions int) peer.ID {
	target := kbucket.ConvertKey(string(key))
	var best peer.ID
	var bestDist kbucket.ID
	for _, m := range members {
		for j := range positions {
			p := kbucket.ConvertKey(string(m) + "/" + strconv.Itoa(j))
			if j == 0 {
				p = kbucket.ConvertPeerID(m)
			}
			if d := kbucket.Xor(p, target); bestDist == nil || bytes.Compare(d, bestDist) < 0 {
				best, bestDist = m, d
			}
		}
	}
	return best
}

// TestMembersAgreeOnMasters starts four members joined through one
// bootstrap member: they agree on the master of 200 keys, and it is the
// member kbucket sorts closest to the key. When one leaves, the others
// stop counting it, its keys move to the member now closest and no other
// key moves, and they agree again.
func TestMembersAgreeOnMasters(t *testing.T) {
	c := newCluster(t, 4)
	ovs, _ := startCluster(t, c, 4)
	changes, stop := ovs[1].Watch()
	defer stop()
	waitMembers(t, ovs, c.ids)

	keys := testKeys(200)
	before := map[string]peer.ID{}
	mastered := map[peer.ID]int{}
	for _, k := range keys {
		m := ovs[0].Master(k)
		for i, o := range ovs[1:] {
			if got := o.Master(k); got != m {
				t.Fatalf("key %s: member 0 says %s, member %d says %s", k, m, i+1, got)
			}
		}
		if want := closest(c.ids, k); m != want {
			t.Fatalf("key %s: master %s, closest by kbucket %s", k, m, want)
		}
		before[string(k)] = m
		mastered[m]++
	}
	t.Logf("keys mastered per member: %v", mastered)

	leaving := ovs[3].ID()
	if err := ovs[3].Close(); err != nil {
		t.Fatal(err)
	}
	remaining := c.ids[:3]
	waitMembers(t, ovs[:3], remaining)
	moved := 0
	for _, k := range keys {
		m := ovs[0].Master(k)
		for i, o := range ovs[1:3] {
			if got := o.Master(k); got != m {
				t.Fatalf("after the leave, key %s: member 0 says %s, member %d says %s", k, m, i+1, got)
			}
		}
		if m == leaving {
			t.Fatalf("key %s still mastered by the member that left", k)
		}
		if want := closest(remaining, k); m != want {
			t.Fatalf("after the leave, key %s: master %s, closest %s", k, m, want)
		}
		if old := before[string(k)]; old != leaving && old != m {
			t.Fatalf("key %s moved from %s to %s, though its master did not leave", k, old, m)
		}
		if before[string(k)] == leaving {
			moved++
		}
	}
	if moved != mastered[leaving] {
		t.Fatalf("%d keys moved, the leaving member mastered %d", moved, mastered[leaving])
	}

	// Watch saw the last change: the three remaining members.
	waitFor(t, "Watch reports the three remaining members", func() bool {
		select {
		case ms := <-changes:
			return slices.Equal(ms, slices.Sorted(slices.Values(remaining)))
		default:
			return false
		}
	})
	if testutil.ToFloat64(ovs[0].m.peers) != 2 {
		t.Errorf("larder_overlay_peers = %v, want 2", testutil.ToFloat64(ovs[0].m.peers))
	}
}

// TestForwarding: through any member's Handler, a put reaches the key's
// master's handler (and no other), and a lookup returns the master's
// answer; the master's own lookups are answered locally. An error of the
// master comes back as a PeerError naming it; a put larger than the
// master's frame limit is refused by the master.
func TestForwarding(t *testing.T) {
	c := newCluster(t, 3)
	ovs, hs := startCluster(t, c, 3)
	waitMembers(t, ovs, c.ids)
	index := map[peer.ID]int{}
	for i, o := range ovs {
		index[o.ID()] = i
	}
	ctx := context.Background()
	keys := testKeys(60)
	for n, k := range keys {
		via := ovs[n%3].Handler()
		if err := via.Put(ctx, protocol.PutRequest{Key: k, Snapshot: 5, Value: []byte("v" + string(k))}); err != nil {
			t.Fatalf("put %s via member %d: %v", k, n%3, err)
		}
	}
	forwarded := 0
	for n, k := range keys {
		m := index[ovs[0].Master(k)]
		for i, h := range hs {
			if h.has(string(k)) != (i == m) {
				t.Fatalf("key %s (master %d): held by member %d: %v", k, m, i, h.has(string(k)))
			}
		}
		for i, o := range ovs {
			res, err := o.Handler().Lookup(ctx, protocol.LookupRequest{Key: k, TMin: 10, TMax: 20})
			if err != nil {
				t.Fatalf("lookup %s via member %d: %v", k, i, err)
			}
			want := fmt.Sprintf("node%d:v%s", m, k)
			if res.Miss != store.Hit || string(res.Value) != want || res.Lo != 10 || res.Hi != 21 {
				t.Fatalf("lookup %s via member %d: %+v, want a hit %q", k, i, res, want)
			}
			if i != m {
				forwarded++
			}
		}
		if n%3 != m {
			forwarded++ // the put
		}
	}
	var counted float64
	for _, o := range ovs {
		counted += testutil.ToFloat64(o.m.requests.WithLabelValues("lookup", routeForwarded)) +
			testutil.ToFloat64(o.m.requests.WithLabelValues("put", routeForwarded))
	}
	if int(counted) != forwarded {
		t.Errorf("forwarded requests counted %v, want %d", counted, forwarded)
	}

	// Stats of another member over the peer protocol.
	st, err := ovs[0].Stats(ctx, ovs[1].ID())
	if err != nil || st.Watermark != 7 || st.Keys != int64(len(hs[1].puts)) {
		t.Errorf("stats of member 1: %+v %v", st, err)
	}

	// An error of the master.
	key := []byte("refused")
	m := ovs[0].Master(key)
	via := ovs[(index[m]+1)%3]
	_, err = via.Handler().Lookup(ctx, protocol.LookupRequest{Key: key})
	var pe *PeerError
	if !errors.As(err, &pe) || !pe.Remote || pe.Peer != m || !strings.Contains(err.Error(), "no such luck") || errors.Is(err, protocol.ErrFrame) {
		t.Fatalf("lookup refused by the master: %v", err)
	}
}

// TestFrameLimit: a member refuses a frame over its MaxFrame with an
// error answer.
func TestFrameLimit(t *testing.T) {
	c := newCluster(t, 2)
	h0, h1 := newRecordingHandler("node0"), newRecordingHandler("node1")
	cfg0 := c.config(0, h0, nil)
	cfg0.MaxFrame = 64 << 10
	o0 := start(t, cfg0)
	o1 := start(t, c.config(1, h1, o0))
	waitMembers(t, []*Overlay{o0, o1}, c.ids)
	err := o1.Put(context.Background(), o0.ID(), protocol.PutRequest{Key: []byte("big"), Snapshot: 1, Value: make([]byte, 100<<10)})
	var pe *PeerError
	if !errors.As(err, &pe) || !pe.Remote || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("put over the frame limit: %v", err)
	}
	if h0.has("big") {
		t.Fatal("the oversized put was stored")
	}
	// The member goes on serving.
	if err := o1.Put(context.Background(), o0.ID(), protocol.PutRequest{Key: []byte("small"), Snapshot: 1, Value: []byte("x")}); err != nil || !h0.has("small") {
		t.Fatalf("put after the refused one: %v", err)
	}
}

// TestForwardDeadline: a master whose handler hangs does not hold the
// forwarding member: the request fails at its deadline, as a timeout.
func TestForwardDeadline(t *testing.T) {
	c := newCluster(t, 2)
	h0, h1 := newRecordingHandler("node0"), newRecordingHandler("node1")
	h0.hang, h1.hang = true, true
	cfg0 := c.config(0, h0, nil)
	o0 := start(t, cfg0)
	cfg1 := c.config(1, h1, o0)
	cfg1.RequestTimeout = 300 * time.Millisecond
	o1 := start(t, cfg1)
	waitMembers(t, []*Overlay{o0, o1}, c.ids)
	var key []byte
	for _, k := range testKeys(100) {
		if o1.Master(k) == o0.ID() {
			key = k
			break
		}
	}
	if key == nil {
		t.Fatal("member 0 masters none of 100 keys")
	}
	done := make(chan error, 1)
	go func() {
		_, err := o1.Handler().Lookup(context.Background(), protocol.LookupRequest{Key: key})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(convergence):
		t.Fatal("the forwarded lookup did not return")
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Remote || pe.Peer != o0.ID() || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("forwarded lookup to a hanging master: %v", err)
	}
	if n := testutil.ToFloat64(o1.m.peerErrors.WithLabelValues("lookup", "timeout")); n != 1 {
		t.Errorf("timeouts counted: %v", n)
	}
	waitFor(t, "the master's handler was called", func() bool { return h0.lookups.Load() == 1 })
}

// TestAddedLatency: a member whose requests are delayed longer than their
// time forwards nothing: the lookup fails with the deadline, and the
// master's handler is never called.
func TestAddedLatency(t *testing.T) {
	c := newCluster(t, 2)
	h0 := newRecordingHandler("node0")
	o0 := start(t, c.config(0, h0, nil))
	cfg1 := c.config(1, newRecordingHandler("node1"), o0)
	cfg1.AddedLatency = time.Hour
	cfg1.RequestTimeout = 100 * time.Millisecond
	o1 := start(t, cfg1)
	waitMembers(t, []*Overlay{o0, o1}, c.ids)
	var key []byte
	for _, k := range testKeys(100) {
		if o1.Master(k) == o0.ID() {
			key = k
			break
		}
	}
	_, err := o1.Handler().Lookup(context.Background(), protocol.LookupRequest{Key: key})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a lookup delayed past its time: %v", err)
	}
	if n := h0.lookups.Load(); n != 0 {
		t.Fatalf("the master answered %d lookups", n)
	}
}

// TestAdmission: a peer without the pre-shared key cannot connect; one
// with the key but not on the allow-list is refused at the handshake
// (counted); neither becomes a member nor gets an answer.
func TestAdmission(t *testing.T) {
	c := newCluster(t, 2)
	ovs, hs := startCluster(t, c, 2)
	waitMembers(t, ovs, c.ids[:2])
	ctx := context.Background()

	// Without the pre-shared key.
	noKey := c.addIdentity(t, "nokey.key")
	cfg := c.config(noKey, newRecordingHandler("outsider"), ovs[0])
	cfg.PSK, cfg.Allow, cfg.Insecure = nil, nil, true
	outsider := start(t, cfg)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := outsider.Host().Connect(cctx, peer.AddrInfo{ID: ovs[0].ID(), Addrs: ovs[0].Host().Addrs()})
	cancel()
	if err == nil {
		t.Fatal("a peer without the pre-shared key connected")
	}
	if err := outsider.Put(ctx, ovs[0].ID(), protocol.PutRequest{Key: []byte("forged"), Snapshot: 1, Value: []byte("x")}); err == nil {
		t.Fatal("a peer without the pre-shared key put")
	}

	// With the key, not on the allow-list.
	stranger := c.addIdentity(t, "stranger.key")
	cfg = c.config(stranger, newRecordingHandler("stranger"), ovs[0])
	cfg.Allow, cfg.Insecure = nil, true
	strange := start(t, cfg)
	before := testutil.ToFloat64(ovs[0].m.refused.WithLabelValues("inbound"))
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	err = strange.Host().Connect(cctx, peer.AddrInfo{ID: ovs[0].ID(), Addrs: ovs[0].Host().Addrs()})
	cancel()
	if err == nil {
		// The dial may complete on the stranger's side before the member's
		// gater closes the connection: the member must close it.
		waitFor(t, "the member closes the stranger's connection", func() bool {
			return len(ovs[0].Host().Network().ConnsToPeer(strange.ID())) == 0
		})
	}
	if _, err := strange.Lookup(ctx, ovs[0].ID(), protocol.LookupRequest{Key: []byte("key-1")}); err == nil {
		t.Fatal("a peer not on the allow-list got an answer")
	}
	if err := strange.Put(ctx, ovs[0].ID(), protocol.PutRequest{Key: []byte("forged"), Snapshot: 1, Value: []byte("x")}); err == nil {
		t.Fatal("a peer not on the allow-list put")
	}
	waitFor(t, "the refusal is counted", func() bool {
		return testutil.ToFloat64(ovs[0].m.refused.WithLabelValues("inbound")) > before
	})
	// A member does not dial it either.
	if err := ovs[1].Host().Connect(ctx, peer.AddrInfo{ID: strange.ID(), Addrs: strange.Host().Addrs()}); err == nil {
		t.Fatal("a member dialled a peer not on the allow-list")
	}

	time.Sleep(3 * c.config(0, nil, nil).LivenessInterval) // let a wrong membership show, if it would
	for i, o := range ovs {
		if !slices.Equal(o.Members(), slices.Sorted(slices.Values(c.ids[:2]))) {
			t.Fatalf("member %d sees members %v", i, o.Members())
		}
	}
	for _, h := range hs {
		if h.has("forged") {
			t.Fatal("a forged put was stored")
		}
	}
}

// TestStartRefusesOpenOverlay: without the pre-shared key or the
// allow-list, Start refuses unless told Insecure.
func TestStartRefusesOpenOverlay(t *testing.T) {
	c := newCluster(t, 1)
	for _, mod := range []func(*Config){
		func(cfg *Config) { cfg.PSK = nil },
		func(cfg *Config) { cfg.Allow = nil },
		func(cfg *Config) { cfg.PSK, cfg.Allow = nil, nil },
	} {
		cfg := c.config(0, newRecordingHandler("x"), nil)
		mod(&cfg)
		if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("Start without admission: %v", err)
		}
	}
}

// TestIdentityPersists: a member restarted with its key file has the same
// peer ID, and is admitted again.
func TestIdentityPersists(t *testing.T) {
	c := newCluster(t, 2)
	ovs, _ := startCluster(t, c, 2)
	waitMembers(t, ovs, c.ids)
	first := ovs[1].ID()
	if err := ovs[1].Close(); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ovs[:1], c.ids[:1])
	again := start(t, c.config(1, newRecordingHandler("node1"), ovs[0]))
	if again.ID() != first {
		t.Fatalf("restarted with peer ID %s, was %s", again.ID(), first)
	}
	waitMembers(t, []*Overlay{ovs[0], again}, c.ids)
}

// TestMasterMatchesKbucket checks placement without hosts: for random
// member sets and keys, Master's choice is the member standing at the
// point kbucket finds closest (one position per member: kbucket's own
// sort), and removing a member moves only its own keys.
func TestMasterMatchesKbucket(t *testing.T) {
	c := newCluster(t, 8)
	single := newMembership(c.ids, 1)
	for _, k := range testKeys(500) {
		if got, want := single.master(kbucket.ConvertKey(string(k))), kbucket.SortClosestPeers(c.ids, kbucket.ConvertKey(string(k)))[0]; got != want {
			t.Fatalf("one position each, key %s: master %s, kbucket's closest %s", k, got, want)
		}
	}
	m := newMembership(c.ids, DefaultVirtualPositions)
	smaller := newMembership(c.ids[1:], DefaultVirtualPositions)
	for _, k := range testKeys(2000) {
		target := kbucket.ConvertKey(string(k))
		got := m.master(target)
		if want := closest(c.ids, k); got != want {
			t.Fatalf("key %s: master %s, kbucket's closest %s", k, got, want)
		}
		if got != c.ids[0] && smaller.master(target) != got {
			t.Fatalf("key %s moved when another member left", k)
		}
	}
}

func TestListenAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:4001":           "/ip4/127.0.0.1/tcp/4001",
		":4001":                    "/ip4/0.0.0.0/tcp/4001",
		"localhost:0":              "/ip4/127.0.0.1/tcp/0",
		"[::1]:4001":               "/ip6/::1/tcp/4001",
		"/ip4/10.0.0.1/tcp/4001":   "/ip4/10.0.0.1/tcp/4001",
		"/ip4/127.0.0.1/tcp/0/p2p": "",
		"example.com:4001":         "",
		"127.0.0.1:99999":          "",
	} {
		a, err := ListenAddr(in)
		switch {
		case want == "" && err == nil:
			t.Errorf("%s: %s, want an error", in, a)
		case want != "" && (err != nil || a.String() != want):
			t.Errorf("%s: %v %v, want %s", in, a, err, want)
		}
	}
}

// BenchmarkForwardedLookup measures a lookup forwarded to the key's master
// on loopback, against the same lookup answered by the master's handler.
func BenchmarkForwardedLookup(b *testing.B) {
	c := newCluster(b, 2)
	h0 := newRecordingHandler("node0")
	o0, err := Start(context.Background(), c.config(0, h0, nil))
	if err != nil {
		b.Fatal(err)
	}
	defer o0.Close()
	o1, err := Start(context.Background(), c.config(1, newRecordingHandler("node1"), o0))
	if err != nil {
		b.Fatal(err)
	}
	defer o1.Close()
	want := slices.Sorted(slices.Values(c.ids))
	for deadline := time.Now().Add(convergence); !slices.Equal(o1.Members(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("no convergence")
		}
	}
	var key []byte
	for _, k := range testKeys(100) {
		if o1.Master(k) == o0.ID() {
			key = k
			break
		}
	}
	ctx := context.Background()
	if err := o1.Handler().Put(ctx, protocol.PutRequest{Key: key, Snapshot: 1, Value: make([]byte, 512)}); err != nil {
		b.Fatal(err)
	}
	q := protocol.LookupRequest{Key: key, TMin: 1, TMax: 2}
	b.Run("local", func(b *testing.B) {
		for b.Loop() {
			if _, err := o0.Handler().Lookup(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("forwarded", func(b *testing.B) {
		for b.Loop() {
			if _, err := o1.Handler().Lookup(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	})
}
