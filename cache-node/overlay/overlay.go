package overlay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	kbucket "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/protocol"
)

// DHTPrefix is the protocol prefix of the overlay's DHT: its own network,
// apart from any public libp2p DHT.
const DHTPrefix = "/larder"

// Defaults of Config.
const (
	DefaultRequestTimeout   = 2 * time.Second
	DefaultServeTimeout     = 10 * time.Second
	DefaultPeerIdleTimeout  = time.Minute
	DefaultPeerReadTimeout  = 30 * time.Second
	DefaultLivenessInterval = time.Second
	DefaultForgetAfter      = 10 * time.Minute
	dialTimeout             = 5 * time.Second
)

// ErrUnauthenticated is Start's refusal to run an overlay that would admit
// peers without both a pre-shared network key and an allow-list, unless
// Config.Insecure says so.
var ErrUnauthenticated = errors.New("overlay: the overlay must be authenticated: give a pre-shared network key and an allow-list of peer IDs, or run it insecure explicitly")

// Config configures a node's membership of the overlay.
type Config struct {
	// Listen are the host's addresses, as multiaddrs (/ip4/0.0.0.0/tcp/4001)
	// or host:port; port 0 picks one. TCP only: the private network's
	// protector works on stream transports only.
	Listen []string
	// KeyFile keeps the node's Ed25519 identity (LoadOrCreateIdentity); its
	// peer ID is what the other members admit.
	KeyFile string
	// PSK is the private network's pre-shared key (ReadPSK): a peer without
	// it fails the first bytes of every connection.
	PSK pnet.PSK
	// Allow lists the peer IDs admitted (ReadAllowList); any other peer is
	// refused at the handshake, either way. This node's own ID need not be
	// on it.
	Allow []peer.ID
	// Insecure lets the overlay run without PSK or without Allow. Without
	// both, anyone who can reach Listen can join, become the master of keys
	// and serve forged results to every member.
	Insecure bool
	// Bootstrap are members to join through (multiaddrs ending in /p2p/ID,
	// ParseBootstrap). None: this node waits to be joined.
	Bootstrap []peer.AddrInfo
	// Handler is the local node: it answers the keys this node masters and
	// the requests members forward here.
	Handler protocol.Handler
	// Registry, if set, receives the overlay's metrics.
	Registry prometheus.Registerer
	Log      *slog.Logger

	// RequestTimeout bounds a request forwarded to a member, answer
	// included (DefaultRequestTimeout); a shorter deadline of the caller's
	// context wins.
	RequestTimeout time.Duration
	// ServeTimeout bounds the local handling of a member's request
	// (DefaultServeTimeout).
	ServeTimeout time.Duration
	// PeerIdleTimeout ends a member's stream idle between requests
	// (DefaultPeerIdleTimeout); PeerReadTimeout bounds the reading of one
	// request frame and the writing of one answer (DefaultPeerReadTimeout).
	PeerIdleTimeout, PeerReadTimeout time.Duration
	// MaxFrame bounds a frame on a member's stream, either way
	// (protocol.DefaultMaxFrame).
	MaxFrame int
	// LivenessInterval is how often the membership is re-read from the
	// routing table and members that disconnected are dialled again
	// (DefaultLivenessInterval); connection events re-read it at once.
	LivenessInterval time.Duration
	// ForgetAfter removes a member from the routing table after it could
	// not be reached that long (DefaultForgetAfter).
	ForgetAfter time.Duration
	// VirtualPositions is how many points of the key space each member
	// stands at (DefaultVirtualPositions; 1: its DHT key only). Every
	// member must use the same number, or they disagree on masters (which
	// costs hit rate, not correctness).
	VirtualPositions int
	// AddedLatency delays every request this node sends to a member by
	// that much before it leaves: an emulation of a slower link between
	// nodes, for benchmarks only (0: none). It counts against
	// RequestTimeout.
	AddedLatency time.Duration
}

func (c *Config) setDefaults() {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&c.RequestTimeout, DefaultRequestTimeout)
	set(&c.ServeTimeout, DefaultServeTimeout)
	set(&c.PeerIdleTimeout, DefaultPeerIdleTimeout)
	set(&c.PeerReadTimeout, DefaultPeerReadTimeout)
	set(&c.LivenessInterval, DefaultLivenessInterval)
	set(&c.ForgetAfter, DefaultForgetAfter)
	if c.MaxFrame <= 0 {
		c.MaxFrame = protocol.DefaultMaxFrame
	}
	if c.VirtualPositions <= 0 {
		c.VirtualPositions = DefaultVirtualPositions
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Overlay is a node's membership of the overlay: its libp2p host, its DHT,
// the live members and the peer protocol.
type Overlay struct {
	cfg   Config
	self  peer.ID
	host  host.Host
	dht   *dht.IpfsDHT
	gater *allowListGater
	m     *metrics
	log   *slog.Logger

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sub    event.Subscription

	members atomic.Pointer[membership]

	mu         sync.Mutex
	watchers   map[int]chan []peer.ID
	nextWatch  int
	dialing    map[peer.ID]bool
	down       map[peer.ID]time.Time     // members in the routing table since they were seen disconnected
	streams    map[peer.ID][]*peerStream // idle streams to members
	refusedLog time.Time

	closeOnce sync.Once
	closeErr  error
}

// membership is the set of live members, this node included, sorted,
// with their positions in the DHT's key space: VirtualPositions each
// (positions), pos[j] of member owner[j].
type membership struct {
	ids   []peer.ID
	pos   [][]byte
	owner []int
}

// DefaultVirtualPositions is how many points of the key space each member
// stands at (Config.VirtualPositions).
const DefaultVirtualPositions = 32

func newMembership(ids []peer.ID, positions int) *membership {
	positions = max(positions, 1)
	m := &membership{ids: ids, pos: make([][]byte, 0, len(ids)*positions), owner: make([]int, 0, len(ids)*positions)}
	for i, id := range ids {
		for j := range positions {
			m.pos = append(m.pos, virtualPosition(id, j))
			m.owner = append(m.owner, i)
		}
	}
	return m
}

// virtualPosition is a member's j-th point in the key space: the first is
// its DHT key (kbucket.ConvertPeerID), the others kbucket.ConvertKey of
// its peer ID's bytes followed by "/" and j in decimal. Every member
// derives every other's points from its ID alone.
func virtualPosition(id peer.ID, j int) []byte {
	if j == 0 {
		return kbucket.ConvertPeerID(id)
	}
	return kbucket.ConvertKey(string(id) + "/" + strconv.Itoa(j))
}

// Start starts the node's libp2p host, joins the DHT through the bootstrap
// peers (in the background: members that cannot be reached yet are dialled
// again every LivenessInterval) and serves the peer protocol, until Close
// or the end of ctx.
func Start(ctx context.Context, cfg Config) (*Overlay, error) {
	cfg.setDefaults()
	if cfg.Handler == nil {
		return nil, errors.New("overlay: no handler")
	}
	if len(cfg.Listen) == 0 {
		return nil, errors.New("overlay: no listen address")
	}
	if (len(cfg.PSK) == 0 || cfg.Allow == nil) && !cfg.Insecure {
		return nil, ErrUnauthenticated
	}
	if len(cfg.PSK) != 0 && len(cfg.PSK) != 32 {
		return nil, fmt.Errorf("overlay: the pre-shared network key is %d bytes; want 32", len(cfg.PSK))
	}
	listen := make([]ma.Multiaddr, 0, len(cfg.Listen))
	for _, s := range cfg.Listen {
		a, err := ListenAddr(s)
		if err != nil {
			return nil, err
		}
		listen = append(listen, a)
	}
	key, err := LoadOrCreateIdentity(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	o := &Overlay{cfg: cfg, log: cfg.Log, watchers: map[int]chan []peer.ID{}, dialing: map[peer.ID]bool{}, down: map[peer.ID]time.Time{},
		streams: map[peer.ID][]*peerStream{}}
	o.m = newMetrics(cfg.Registry, func() float64 {
		if o.dht == nil {
			return 0
		}
		return float64(o.dht.RoutingTable().Size())
	})
	o.gater = newAllowListGater(cfg.Allow, o.refused)
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.ListenAddrs(listen...),
		libp2p.Transport(tcp.NewTCPTransport), // replaces the default transports: no QUIC, WebTransport, WebRTC
		libp2p.ConnectionGater(o.gater),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(), // libp2p's own metrics go to the global registry; the overlay's go to cfg.Registry
		libp2p.Ping(true),
	}
	if len(cfg.PSK) != 0 {
		opts = append(opts, libp2p.PrivateNetwork(cfg.PSK))
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("overlay: libp2p host: %w", err)
	}
	o.host, o.self = h, h.ID()
	o.ctx, o.cancel = context.WithCancel(context.Background())
	h.SetStreamHandler(PeerProtocol, o.handleStream)
	kad, err := dht.New(h,
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(DHTPrefix),
		dht.DisableValues(),    // the DHT only routes: members store nothing for each other
		dht.DisableProviders(), // through it
		dht.BootstrapPeers(cfg.Bootstrap...),
	)
	if err != nil {
		h.Close()
		o.cancel()
		return nil, fmt.Errorf("overlay: DHT: %w", err)
	}
	o.dht = kad
	o.sub, err = h.EventBus().Subscribe([]any{new(event.EvtPeerConnectednessChanged), new(event.EvtPeerIdentificationCompleted)})
	if err != nil {
		o.Close()
		return nil, fmt.Errorf("overlay: event bus: %w", err)
	}
	o.members.Store(newMembership([]peer.ID{o.self}, o.cfg.VirtualPositions))
	for _, b := range cfg.Bootstrap {
		if b.ID != o.self {
			o.dial(b)
		}
	}
	o.wg.Add(1)
	go o.run()
	context.AfterFunc(ctx, func() { o.Close() })
	o.log.Info("overlay started", "peer_id", o.self.String(), "addrs", fmt.Sprint(o.Addrs()),
		"private_network", len(cfg.PSK) != 0, "allow_list", len(cfg.Allow), "bootstrap", len(cfg.Bootstrap))
	return o, nil
}

// ID is this node's peer ID.
func (o *Overlay) ID() peer.ID { return o.self }

// Addrs are this node's addresses, each ending in /p2p/ID: what the other
// members bootstrap through.
func (o *Overlay) Addrs() []ma.Multiaddr {
	addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: o.self, Addrs: o.host.Addrs()})
	if err != nil {
		return nil
	}
	return addrs
}

// Host is the node's libp2p host.
func (o *Overlay) Host() host.Host { return o.host }

// Handler is the local handler with the overlay: lookups and puts of keys
// another live member masters are forwarded to it and answered with its
// answer (nothing is kept here); the rest are answered by Config.Handler.
// A forwarding that fails is an error (a *PeerError), not a local answer.
func (o *Overlay) Handler() protocol.Handler { return forwarder{o} }

// Members are the live members, this node included, sorted.
func (o *Overlay) Members() []peer.ID { return slices.Clone(o.members.Load().ids) }

// Master is the live member, this node included, standing at the point
// of the key space closest to the key in the DHT's metric: the XOR of
// kbucket.ConvertKey(key) and each member's virtual positions
// (Config.VirtualPositions; the first is kbucket.ConvertPeerID(member)),
// compared as big-endian numbers. Members that see the same live set and
// use the same number of positions agree on every key's master. Several
// positions per member even out the members' shares of the keys, which
// with one position each are very unequal among few members.
func (o *Overlay) Master(key []byte) peer.ID {
	return o.members.Load().master(kbucket.ConvertKey(string(key)))
}

func (m *membership) master(target kbucket.ID) peer.ID {
	best := 0
	for j := 1; j < len(m.pos); j++ {
		if xorLess(m.pos[j], m.pos[best], target) {
			best = j
		}
	}
	return m.ids[m.owner[best]]
}

// xorLess reports whether a is closer to t than b is, in XOR distance
// (all three of one length).
func xorLess(a, b, t []byte) bool {
	for i := range t {
		da, db := a[i]^t[i], b[i]^t[i]
		if da != db {
			return da < db
		}
	}
	return false
}

// Watch returns a channel that receives the live members (as Members)
// after every change, and a function that stops it. A reader that falls
// behind gets the latest set only.
func (o *Overlay) Watch() (<-chan []peer.ID, func()) {
	ch := make(chan []peer.ID, 1)
	o.mu.Lock()
	id := o.nextWatch
	o.nextWatch++
	o.watchers[id] = ch
	o.mu.Unlock()
	return ch, func() {
		o.mu.Lock()
		delete(o.watchers, id)
		o.mu.Unlock()
	}
}

// Close leaves the overlay: the peer protocol, the DHT and the host stop,
// and the members see this node's connections close.
func (o *Overlay) Close() error {
	o.closeOnce.Do(func() {
		o.cancel()
		if o.sub != nil {
			o.sub.Close()
		}
		o.host.RemoveStreamHandler(PeerProtocol)
		err := o.dht.Close()
		if herr := o.host.Close(); err == nil {
			err = herr
		}
		o.wg.Wait()
		o.closeErr = err
	})
	return o.closeErr
}

// run keeps the membership current until Close.
func (o *Overlay) run() {
	defer o.wg.Done()
	t := time.NewTicker(o.cfg.LivenessInterval)
	defer t.Stop()
	o.refresh()
	for {
		select {
		case <-o.ctx.Done():
			return
		case _, ok := <-o.sub.Out():
			if !ok {
				return
			}
			o.refresh()
		case <-t.C:
			o.redial()
			o.refresh()
		}
	}
}

// refresh re-reads the live members: the routing table's peers that are
// connected and speak PeerProtocol (as identify reported). A member whose connection closes (it left, or crashed: yamux's
// keep-alive notices a silent one) stops being live at once; it is live
// again when a dial succeeds.
func (o *Overlay) refresh() {
	live := []peer.ID{o.self}
	for _, p := range o.dht.RoutingTable().ListPeers() {
		if o.host.Network().Connectedness(p) != network.Connected || !o.gater.allowed(p) {
			continue
		}
		// A peer that does not speak this peer protocol (another version)
		// cannot be forwarded to: not a member.
		if protos, err := o.host.Peerstore().SupportsProtocols(p, PeerProtocol); err != nil || len(protos) == 0 {
			continue
		}
		live = append(live, p)
	}
	slices.Sort(live)
	old := o.members.Load()
	if slices.Equal(old.ids, live) {
		return
	}
	joined, left := diff(old.ids, live)
	o.members.Store(newMembership(live, o.cfg.VirtualPositions))
	o.dropStreams(live)
	o.m.membershipChanges.Inc()
	o.m.peers.Set(float64(len(live) - 1))
	o.log.Info("overlay membership changed", "members", len(live), "joined", fmt.Sprint(joined), "left", fmt.Sprint(left))
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ch := range o.watchers {
		select {
		case <-ch: // drop the set the reader has not taken
		default:
		}
		ch <- slices.Clone(live)
	}
}

// diff: what b has that a has not, and the reverse (both sorted).
func diff(a, b []peer.ID) (added, removed []peer.ID) {
	for _, p := range b {
		if _, ok := slices.BinarySearch(a, p); !ok {
			added = append(added, p)
		}
	}
	for _, p := range a {
		if _, ok := slices.BinarySearch(b, p); !ok {
			removed = append(removed, p)
		}
	}
	return added, removed
}

// redial dials the routing table's members that are not connected (a
// member unreachable for ForgetAfter is removed from it), and the
// bootstrap peers while no other member is live.
func (o *Overlay) redial() {
	now := time.Now()
	rt := o.dht.RoutingTable()
	for _, p := range rt.ListPeers() {
		if o.host.Network().Connectedness(p) == network.Connected {
			o.mu.Lock()
			delete(o.down, p)
			o.mu.Unlock()
			continue
		}
		o.mu.Lock()
		since, ok := o.down[p]
		if !ok {
			o.down[p] = now
			since = now
		}
		o.mu.Unlock()
		if now.Sub(since) > o.cfg.ForgetAfter {
			o.log.Info("overlay: forgetting an unreachable member", "peer", p.String(), "since", since)
			rt.RemovePeer(p)
			o.mu.Lock()
			delete(o.down, p)
			o.mu.Unlock()
			continue
		}
		o.dial(peer.AddrInfo{ID: p})
	}
	if len(o.members.Load().ids) == 1 {
		for _, b := range o.cfg.Bootstrap {
			if b.ID != o.self {
				o.dial(b)
			}
		}
	}
}

// dial connects to a peer in the background (one dial per peer at a
// time); a success refreshes the routing table, which finds the members
// the peer knows.
func (o *Overlay) dial(ai peer.AddrInfo) {
	o.mu.Lock()
	if o.dialing[ai.ID] || o.ctx.Err() != nil {
		o.mu.Unlock()
		return
	}
	o.dialing[ai.ID] = true
	o.wg.Add(1)
	o.mu.Unlock()
	go func() {
		defer o.wg.Done()
		defer func() {
			o.mu.Lock()
			delete(o.dialing, ai.ID)
			o.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(o.ctx, dialTimeout)
		defer cancel()
		if err := o.host.Connect(ctx, ai); err != nil {
			o.log.Debug("overlay: dial failed", "peer", ai.ID.String(), "err", err)
			return
		}
		select {
		case <-o.dht.RefreshRoutingTable():
		case <-o.ctx.Done():
		}
	}()
}

// refused counts, and now and then logs, a connection the allow-list
// refused.
func (o *Overlay) refused(dir network.Direction, p peer.ID) {
	d := "inbound"
	if dir == network.DirOutbound {
		d = "outbound"
	}
	o.m.refused.WithLabelValues(d).Inc()
	o.mu.Lock()
	logIt := time.Since(o.refusedLog) > 10*time.Second
	if logIt {
		o.refusedLog = time.Now()
	}
	o.mu.Unlock()
	if logIt {
		o.log.Warn("overlay: refused a peer that is not on the allow-list", "peer", p.String(), "direction", d)
	}
}

// ListenAddr parses a listen address: a multiaddr, or host:port (an IP
// address or "localhost"; an empty host listens on every IPv4 address).
func ListenAddr(s string) (ma.Multiaddr, error) {
	if strings.HasPrefix(s, "/") {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("overlay: listen address %q: %w", s, err)
		}
		return a, nil
	}
	hostPart, portPart, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("overlay: listen address %q: %w", s, err)
	}
	port, err := strconv.ParseUint(portPart, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("overlay: listen address %q: bad port", s)
	}
	switch hostPart {
	case "":
		hostPart = "0.0.0.0"
	case "localhost":
		hostPart = "127.0.0.1"
	}
	ip := net.ParseIP(hostPart)
	if ip == nil {
		return nil, fmt.Errorf("overlay: listen address %q: want an IP address", s)
	}
	family := "ip6"
	if ip.To4() != nil {
		family, ip = "ip4", ip.To4()
	}
	return ma.NewMultiaddr(fmt.Sprintf("/%s/%s/tcp/%d", family, ip, port))
}

// ParseBootstrap parses bootstrap peers: multiaddrs ending in /p2p/ID,
// addresses of one peer merged.
func ParseBootstrap(addrs []string) ([]peer.AddrInfo, error) {
	var ms []ma.Multiaddr
	for _, s := range addrs {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap peer %q: %w", s, err)
		}
		if _, err := a.ValueForProtocol(ma.P_P2P); err != nil {
			return nil, fmt.Errorf("bootstrap peer %q: no /p2p/ID", s)
		}
		ms = append(ms, a)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(ms...)
	if err != nil {
		return nil, fmt.Errorf("bootstrap peers: %w", err)
	}
	return infos, nil
}
