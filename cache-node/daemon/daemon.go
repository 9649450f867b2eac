package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/overlay"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/redisstore"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/secret"
)

// Options configure a cache-node.
type Options struct {
	Listen  string // address of the protocol; "127.0.0.1:0" picks a port
	NATS    string // NATS URL
	Prefix  string // subject prefix
	Store   string // "memory" or a redis:// URL
	Memory  int64  // byte budget
	Metrics string // address of /metrics; "" for none
	// MetricsListener, when set, serves /metrics instead of listening on
	// Metrics (a caller that picked a free port keeps it bound); Run
	// closes it.
	MetricsListener net.Listener
	MaxFrame        int
	// TLS, when set, serves the protocol over TLS; with ClientAuth
	// tls.RequireAndVerifyClientCert (pki.ServerTLS) a peer without a
	// certificate from the clients' CA is refused at the handshake.
	TLS *tls.Config
	// NATSOptions are added to the NATS connection's options: the node's
	// credentials (nats.NkeyOptionFromSeed) and TLS.
	NATSOptions []nats.Option
	// The protocol server's limits (see protocol.Server): 0 takes the
	// default, < 0 turns the limit off.
	MaxInFlight                            int64
	MaxConns                               int
	IdleTimeout, ReadTimeout, WriteTimeout time.Duration
	// LoadLease: see node.Config.LoadLease (0: the default, < 0: none).
	LoadLease time.Duration
	// WatermarkWait: see node.Config.WatermarkWait (0: the default, < 0:
	// never).
	WatermarkWait time.Duration
	// Linger: see node.Config.Linger (0: the default, < 0: none).
	Linger time.Duration
	// BroadcastInvalidation: see node.Config.Broadcast (the ablation).
	BroadcastInvalidation bool
	// Overlay, when set, makes the node a member of the libp2p overlay
	// (package overlay): a lookup or put of a key another live member
	// masters is forwarded to that member, whatever the client asked
	// (nothing is kept here); the others are answered by this node.
	// Handler and Registry are the node's; Log defaults to the node's.
	// Nil: no overlay, every key is answered here.
	Overlay *overlay.Config
	// OverlayStarted, if set, is called with the overlay once it runs.
	OverlayStarted func(*overlay.Overlay)
}

// Run runs a cache-node until ctx ends; ready, if not nil, receives the
// address it serves on.
func Run(ctx context.Context, o Options, log *slog.Logger, ready chan<- string) error {
	if o.MetricsListener != nil {
		defer o.MetricsListener.Close()
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = protocol.DefaultMaxFrame
	}
	if o.Prefix == "" {
		o.Prefix = invalidation.DefaultPrefix
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	natsOpts := append([]nats.Option{nats.Name("larder-cache-node"), nats.MaxReconnects(-1), node.SyncQueueLen(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS", "err", err) })}, o.NATSOptions...)
	nc, err := nats.Connect(o.NATS, natsOpts...)
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", secret.RedactURL(o.NATS), err)
	}
	defer nc.Close()

	var n *node.Node
	backend, err := openStore(ctx, o, log, func(names []string) { n.OnRelease(names) })
	if err != nil {
		return err
	}
	defer backend.Close()
	n, err = node.New(node.Config{NATS: nc, Prefix: o.Prefix, Backend: backend, Log: log, Metrics: reg,
		LoadLease: o.LoadLease, WatermarkWait: o.WatermarkWait, Linger: o.Linger, Broadcast: o.BroadcastInvalidation})
	if err != nil {
		return err
	}
	if o.Store == "memory" {
		reg.MustRegister(overheadGauge(backend))
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	if o.TLS != nil {
		ln = tls.NewListener(ln, o.TLS)
	}
	if mln := o.MetricsListener; mln != nil || o.Metrics != "" {
		if mln == nil {
			if mln, err = net.Listen("tcp", o.Metrics); err != nil {
				ln.Close()
				return fmt.Errorf("metrics listener: %w", err)
			}
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(mln) }()
		defer srv.Close()
	}
	handler := n.Handler()
	if o.Overlay != nil {
		cfg := *o.Overlay
		cfg.Handler, cfg.Registry = handler, reg
		if cfg.Log == nil {
			cfg.Log = log
		}
		ov, err := overlay.Start(ctx, cfg)
		if err != nil {
			ln.Close()
			return err
		}
		defer ov.Close()
		handler = ov.Handler()
		if o.OverlayStarted != nil {
			o.OverlayStarted(ov)
		}
	}
	log.Info("serving", "addr", ln.Addr().String(), "store", storeName(o.Store), "budget", o.Memory, "tls", o.TLS != nil, "overlay", o.Overlay != nil,
		"broadcast_invalidation", o.BroadcastInvalidation,
		"client_auth", o.TLS != nil && o.TLS.ClientAuth == tls.RequireAndVerifyClientCert)
	if ready != nil {
		ready <- ln.Addr().String()
	}

	nodeErr := make(chan error, 1)
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { nodeErr <- n.Run(nctx) }()
	srv := &protocol.Server{Handler: handler, MaxFrame: o.MaxFrame, MaxInFlight: o.MaxInFlight,
		MaxConns: o.MaxConns, IdleTimeout: o.IdleTimeout, ReadTimeout: o.ReadTimeout,
		WriteTimeout: o.WriteTimeout, Log: log}
	reg.MustRegister(srv.Collector())
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(nctx, ln) }()
	select {
	case err = <-nodeErr:
		cancel()
		<-srvErr
	case err = <-srvErr:
		cancel()
		<-nodeErr
	case <-ctx.Done():
		cancel()
		<-srvErr
		err = <-nodeErr
	}
	return err
}

// MemoryLimit is the soft limit of the Go runtime for a node process
// with a memory budget: the budget, an eighth more for the structures
// around the counted bytes, and 64 MiB for connections, the ghost set and
// the runtime. The Go collector lets the heap reach twice the live data
// before it runs (GOGC=100): with a full budget that alone doubles RSS;
// a limit near the budget makes it collect sooner. The command sets it
// (the process is the node's alone); GOMEMLIMIT overrides it.
func MemoryLimit(budget int64) int64 { return budget + budget/8 + 64<<20 }

// overheadGauge reports the memory the Go runtime holds beyond what the
// memory store counts against its budget: the values' and keys' bytes
// are counted, but not the maps, indexes and per-version structures
// around them, the garbage not yet collected, nor the connections'
// buffers. RSS is close to the budget plus this.
func overheadGauge(b store.Backend) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "larder_node_memory_overhead_bytes",
		Help: "Memory the Go runtime holds from the OS beyond the store's counted bytes (larder_node_bytes): indexes, structures, garbage not yet collected, connection buffers.",
	}, func() float64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st, err := b.Stats(context.Background())
		if err != nil {
			return -1
		}
		return float64(int64(ms.Sys-ms.HeapReleased) - st.Bytes)
	})
}

func storeName(s string) string {
	if s == "memory" {
		return s
	}
	return "redis"
}

func openStore(ctx context.Context, o Options, log *slog.Logger, onRelease func([]string)) (store.Backend, error) {
	if o.Store == "memory" {
		return store.NewMemory(o.Memory, onRelease), nil
	}
	return openRedis(ctx, o, log)
}

// openRedis fronts the Redis at o.Store, with o.Memory as its budget.
type redisBackend struct {
	*redisstore.Store
	client *redis.Client
}

func (b redisBackend) Close() error {
	err := b.Store.Close()
	if cerr := b.client.Close(); err == nil {
		err = cerr
	}
	return err
}

func openRedis(ctx context.Context, o Options, log *slog.Logger) (store.Backend, error) {
	opts, err := redis.ParseURL(o.Store)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// go-redis would send CLIENT SETINFO, which a least-privilege ACL
	// user need not be granted.
	opts.DisableIdentity = true
	client := redis.NewClient(opts)
	s, err := redisstore.New(ctx, redisstore.Options{Client: client, Prefix: o.Prefix, MaxMemory: o.Memory, Log: log})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store %s: %w", secret.RedactURL(o.Store), err)
	}
	return redisBackend{Store: s, client: client}, nil
}
