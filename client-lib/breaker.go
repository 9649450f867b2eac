package larder

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// Cache-node calls are bounded and a node that fails is left alone for a
// while: a read-only transaction never waits on a frozen, black-holed or
// dead node longer than one call's deadline, and after a few failures not
// at all.
const (
	// DefaultNodeTimeout bounds one cache-node call (dial included).
	DefaultNodeTimeout = 100 * time.Millisecond
	// DefaultNodeBackoff is how long a node whose breaker opened is left
	// alone before it is probed.
	DefaultNodeBackoff = 500 * time.Millisecond
	// DefaultMissWait is how long a lookup that misses may wait at the
	// node for another client's load of the same key: about a load at a
	// pin on PostgreSQL and the put that follows it.
	DefaultMissWait = 30 * time.Millisecond
	// nodeFailures consecutive failed calls open a node's breaker.
	nodeFailures = 3
	// maxBackoffFactor bounds the back-off: it doubles after each failed
	// probe, up to this many times the initial one.
	maxBackoffFactor = 16
)

// errNodeBypassed: the node's breaker is open; the call was not made.
var errNodeBypassed = errors.New("cache-node bypassed: its breaker is open")

// nodeState is a node's breaker state (the larder_client_node_state gauge).
type nodeState int

const (
	nodeClosed  nodeState = iota // in use
	nodeOpen                     // bypassed until its back-off ends
	nodeProbing                  // bypassed; a probe is out
)

func (s nodeState) String() string {
	switch s {
	case nodeClosed:
		return "closed"
	case nodeOpen:
		return "open"
	default:
		return "probing"
	}
}

// nodeClient is one cache-node behind a circuit breaker. A call that
// times out or fails on the connection counts as a failure (an answer,
// even an error the node reports, does not; nor does a call the caller's
// own context ended). After nodeFailures consecutive failures the breaker
// opens: calls are not made, the reads go to PostgreSQL. When the
// back-off ends a background probe (a stats request) asks the node; an
// answer closes the breaker, a failure doubles the back-off.
type nodeClient struct {
	addr    string
	c       *Client
	newConn func() *protocol.Client

	mu       sync.Mutex
	cl       *protocol.Client // its idle connections are dropped after a failure
	state    nodeState
	fails    int       // consecutive failures
	until    time.Time // end of the back-off (open)
	backoff  time.Duration
	closedAt time.Time // when the breaker last closed after a probe

	afterL1 afterL1Gate // lookups after L1 misses (a client with an L1)
}

// lookupCounted asks the node for q (counted in Stats.NodeLookups). A
// read that follows an L1 miss (afterL1) goes through the node's
// afterL1Gate: when the gate skips it, asked is false (the skip is
// counted), and a lookup's outcome feeds the gate.
func (n *nodeClient) lookupCounted(ctx context.Context, q *protocol.LookupRequest, afterL1 bool) (r protocol.LookupResponse, asked bool, err error) {
	if afterL1 && !n.afterL1.ask() {
		n.c.stats.NodeSkips.Add(1)
		n.c.m.nodeSkips.Inc()
		return r, false, nil
	}
	n.c.stats.NodeLookups.Add(1)
	r, err = n.lookup(ctx, q)
	if err == nil && afterL1 {
		n.sawAfterL1(r.Miss == store.Hit)
	}
	return r, true, err
}

// sawAfterL1 records the outcome of a lookup that followed an L1 miss.
func (n *nodeClient) sawAfterL1(hit bool) {
	switch changed, hits, lookups := n.afterL1.saw(hit); changed {
	case +1:
		n.c.cfg.Log.Info("larder: cache-node lookups after L1 misses paused: the node rarely holds what the L1 misses; one in 16 still asks",
			"node", n.addr, "hits", hits, "lookups", lookups)
	case -1:
		n.c.cfg.Log.Info("larder: cache-node lookups after L1 misses resumed", "node", n.addr, "hits", hits, "probes", lookups)
	}
}

// nodeIdleConns is how many idle connections a client keeps to each
// node. A connection beyond it is closed when its request is done, so a
// busy client (reads and asynchronous puts) that kept fewer would open a
// new one, with its TLS handshake, for much of its requests.
const nodeIdleConns = 64

func newNodeClient(c *Client, addr string) *nodeClient {
	n := &nodeClient{addr: addr, c: c, backoff: c.cfg.NodeBackoff}
	n.newConn = func() *protocol.Client {
		if c.cfg.NodeTLS != nil {
			return protocol.NewTLSClient(addr, nodeIdleConns, c.cfg.NodeTLS)
		}
		return protocol.NewClient(addr, nodeIdleConns)
	}
	n.cl = n.newConn()
	c.m.nodeState.WithLabelValues(addr).Set(float64(nodeClosed))
	return n
}

// lookup asks the node for a version of a key, within the node timeout.
func (n *nodeClient) lookup(ctx context.Context, q *protocol.LookupRequest) (protocol.LookupResponse, error) {
	var res protocol.LookupResponse
	err := n.call(ctx, func(ctx context.Context, cl *protocol.Client) error {
		req := q
		if w := n.missWait(ctx); w > 0 {
			withWait := *q
			withWait.Wait = w
			req = &withWait
		}
		var err error
		res, err = cl.Lookup(ctx, req)
		return err
	})
	return res, err
}

// missWait is how long the node may hold a lookup that misses while
// another client loads the key (Config.MissWait): at most half of what is
// left of the call's deadline, so that a node that waits is never taken
// for one that does not answer.
func (n *nodeClient) missWait(ctx context.Context) time.Duration {
	w := n.c.cfg.MissWait
	if dl, ok := ctx.Deadline(); ok {
		w = min(w, time.Until(dl)/2)
	}
	if w < time.Millisecond {
		return 0
	}
	return w
}

// put sends a version to the node, within the node timeout.
func (n *nodeClient) put(ctx context.Context, p *protocol.PutRequest) error {
	return n.call(ctx, func(ctx context.Context, cl *protocol.Client) error { return cl.Put(ctx, p) })
}

// usable reports whether calls are made (the breaker is closed).
func (n *nodeClient) usable() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state == nodeClosed
}

// available is usable for a placement choosing among nodes: an open
// breaker whose back-off has ended starts its probe, as a call to the node
// would, so that a node the placement passes over while it is open still
// comes back once it answers.
func (n *nodeClient) available() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state == nodeOpen && !time.Now().Before(n.until) && n.c.goBackground(n.probe) {
		n.setState(nodeProbing)
	}
	return n.state == nodeClosed
}

// State is the breaker's state: "closed" (in use), "open" (bypassed) or
// "probing" (bypassed, a probe is out).
func (n *nodeClient) State() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state.String()
}

func (n *nodeClient) call(ctx context.Context, f func(context.Context, *protocol.Client) error) error {
	cl, ok := n.admit()
	if !ok {
		n.c.stats.NodeBypassed.Add(1)
		n.c.m.nodeBypassed.WithLabelValues(n.addr).Inc()
		return errNodeBypassed
	}
	cctx, cancel, clipped := callContext(ctx, n.c.cfg.NodeTimeout)
	err := f(cctx, cl)
	cancel()
	if clipped && isTimeout(err) {
		return err // the caller's deadline was short: says nothing of the node
	}
	n.done(ctx, cl, err)
	return err
}

// callContext bounds a node call by timeout and by half of what is left
// of the caller's deadline (then clipped), so that a node that does not
// answer leaves the caller time for PostgreSQL.
func callContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc, bool) {
	clipped := false
	if dl, ok := ctx.Deadline(); ok {
		if half := time.Until(dl) / 2; half < timeout {
			timeout, clipped = max(half, time.Millisecond), true
		}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	return cctx, cancel, clipped
}

// admit returns the connection pool to call on, or false when the breaker
// is open; the first call after the back-off starts a probe.
func (n *nodeClient) admit() (*protocol.Client, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch n.state {
	case nodeClosed:
		return n.cl, true
	case nodeOpen:
		if !time.Now().Before(n.until) && n.c.goBackground(n.probe) {
			n.setState(nodeProbing)
		}
	}
	return nil, false
}

// done records a call's outcome; parent is the caller's context.
func (n *nodeClient) done(parent context.Context, cl *protocol.Client, err error) {
	if err == nil || protocol.IsRemote(err) {
		n.mu.Lock()
		n.fails = 0
		n.mu.Unlock()
		return
	}
	if parent.Err() != nil {
		return // the caller gave up: says nothing of the node
	}
	n.c.stats.NodeErrors.Add(1)
	n.c.m.nodeErrors.Inc()
	if isTimeout(err) {
		n.c.stats.NodeTimeouts.Add(1)
		n.c.m.nodeTimeouts.WithLabelValues(n.addr).Inc()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if cl == n.cl {
		// The node restarted, froze or went away: the idle connections
		// are as suspect as the one that failed.
		n.cl = n.newConn()
		go cl.Close()
	}
	n.fails++
	if n.state == nodeClosed && n.fails >= nodeFailures {
		n.open()
		n.c.cfg.Log.Warn("larder: cache-node failing; its reads go to PostgreSQL until it answers again",
			"node", n.addr, "failures", n.fails, "err", err, "retry_in", n.backoff)
	}
}

// open opens the breaker (n.mu held). A node that fails again soon after
// it came back waits twice as long as before.
func (n *nodeClient) open() {
	if n.closedAt.IsZero() || time.Since(n.closedAt) > maxBackoffFactor*n.c.cfg.NodeBackoff {
		n.backoff = n.c.cfg.NodeBackoff
	} else {
		n.backoff = min(2*n.backoff, maxBackoffFactor*n.c.cfg.NodeBackoff)
	}
	n.until = time.Now().Add(n.backoff)
	n.setState(nodeOpen)
	n.c.stats.BreakerOpens.Add(1)
	n.c.m.breakerOpens.WithLabelValues(n.addr).Inc()
}

// probe asks the node for its stats: an answer closes the breaker.
func (n *nodeClient) probe() {
	n.mu.Lock()
	cl := n.cl
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), n.c.cfg.NodeTimeout)
	_, err := cl.Stats(ctx)
	cancel()
	n.c.m.nodeProbes.WithLabelValues(n.addr).Inc()
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil || protocol.IsRemote(err) {
		n.fails, n.closedAt = 0, time.Now()
		n.setState(nodeClosed)
		n.c.cfg.Log.Info("larder: cache-node answers again; reads use it", "node", n.addr)
		return
	}
	if cl == n.cl {
		n.cl = n.newConn()
		go cl.Close()
	}
	n.backoff = min(2*n.backoff, maxBackoffFactor*n.c.cfg.NodeBackoff)
	n.until = time.Now().Add(n.backoff)
	n.setState(nodeOpen)
}

func (n *nodeClient) setState(s nodeState) {
	n.state = s
	n.c.m.nodeState.WithLabelValues(n.addr).Set(float64(s))
}

func (n *nodeClient) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = n.cl.Close()
}

// isTimeout reports a deadline that ended a call: the node did not answer
// (or accept the connection) in time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
