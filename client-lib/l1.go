package larder

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/store"
)

// openL1 makes the L1: a memory backend of Config.L1Bytes and the node
// that follows the invalidation stream for it, on the client's NATS
// connection. The node reasons exactly as a cache-node does (its
// watermark, group subscriptions confirmed against JetStream, gaps), so
// what it serves is valid at every timestamp it reports; only its
// metrics are the client's (larder_client_reads_total{source="l1"},
// larder_client_l1_watermark_lsn).
func (c *Client) openL1() error {
	var near *node.Node
	c.l1 = store.NewMemory(c.cfg.L1Bytes, func(names []string) { near.OnRelease(names) })
	near, err := node.New(node.Config{
		NATS:      c.nc,
		Prefix:    c.cfg.Prefix,
		Backend:   c.l1,
		LoadLease: -1, // one process: its misses collapse in c.flight
		Broadcast: c.cfg.L1Broadcast,
		Log:       c.cfg.Log.With("cache", "l1"),
	})
	if err != nil {
		return err
	}
	c.near = near
	if c.cfg.Metrics != nil {
		if err := c.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "larder_client_l1_watermark_lsn",
			Help: "LSN up to which the L1 knows every invalidation of what it holds (0: not yet).",
		}, func() float64 { return float64(near.Watermark()) })); err != nil {
			return err
		}
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		if err := near.Run(c.ctx); err != nil {
			// Its watermark stops: the L1 serves nothing newer.
			c.cfg.Log.Error("larder: the L1 stopped following invalidations; it serves nothing newer than its watermark", "err", err)
		}
	}()
	return nil
}

// l1IgnoresWatermarkForTest breaks the L1 on purpose (its versions are
// served as if every invalidation were applied) so that a test can show
// the history checker notices.
var l1IgnoresWatermarkForTest bool

// l1Lookup looks for a version of key valid in [tmin, tmax] in the L1.
func (c *Client) l1Lookup(ctx context.Context, key []byte, tmin, tmax uint64, template string) (store.Result, error) {
	if l1IgnoresWatermarkForTest {
		return c.l1.Lookup(ctx, key, tmin, tmax, store.Open)
	}
	return c.near.Lookup(ctx, key, tmin, tmax, template)
}

// l1Put puts a result the client computed at snapshot into the L1: the
// L1's node gives it its interval, open-ended until an invalidation of
// one of deps (absorbs: one that does not name its rows,
// store.Version.Absorbs).
func (c *Client) l1Put(ctx context.Context, key []byte, snapshot uint64, deps []store.Dep, value []byte, template string, absorbs bool) {
	_ = c.near.Put(ctx, node.PutRequest{Key: key, Snapshot: snapshot, Deps: deps, Value: value, Template: template, Absorbs: absorbs})
}

// l1Keep keeps a version valid in [lo, hi), proved elsewhere (a
// cache-node's hit) or known only at its own snapshot (hi = lo + 1), in
// the L1 as it is: closed, with nothing to invalidate.
func (c *Client) l1Keep(ctx context.Context, key []byte, lo, hi, snapshot uint64, value []byte) {
	_ = c.l1.Put(ctx, key, &store.Version{Lo: lo, Hi: hi, Snapshot: snapshot, Value: value})
}
