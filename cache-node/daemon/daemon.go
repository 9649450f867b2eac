package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/redisstore"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// Options configure a cache-node.
type Options struct {
	Listen   string // address of the protocol; "127.0.0.1:0" picks a port
	NATS     string // NATS URL
	Prefix   string // subject prefix
	Store    string // "memory" or a redis:// URL
	Memory   int64  // byte budget
	Metrics  string // address of /metrics; "" for none
	MaxFrame int
}

// Run runs a cache-node until ctx ends; ready, if not nil, receives the
// address it serves on.
func Run(ctx context.Context, o Options, log *slog.Logger, ready chan<- string) error {
	if o.MaxFrame <= 0 {
		o.MaxFrame = protocol.DefaultMaxFrame
	}
	if o.Prefix == "" {
		o.Prefix = invalidation.DefaultPrefix
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	nc, err := nats.Connect(o.NATS, nats.Name("larder-cache-node"), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS", "err", err) }))
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", o.NATS, err)
	}
	defer nc.Close()

	var n *node.Node
	backend, err := openStore(ctx, o, func(names []string) { n.OnRelease(names) })
	if err != nil {
		return err
	}
	defer backend.Close()
	n, err = node.New(node.Config{NATS: nc, Prefix: o.Prefix, Backend: backend, Log: log, Metrics: reg})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	if o.Metrics != "" {
		mln, err := net.Listen("tcp", o.Metrics)
		if err != nil {
			ln.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(mln) }()
		defer srv.Close()
	}
	log.Info("serving", "addr", ln.Addr().String(), "store", storeName(o.Store), "budget", o.Memory)
	if ready != nil {
		ready <- ln.Addr().String()
	}

	nodeErr := make(chan error, 1)
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { nodeErr <- n.Run(nctx) }()
	srv := &protocol.Server{Handler: n.Handler(), MaxFrame: o.MaxFrame, Log: log}
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

func storeName(s string) string {
	if s == "memory" {
		return s
	}
	return "redis"
}

func openStore(ctx context.Context, o Options, onRelease func([]string)) (store.Backend, error) {
	if o.Store == "memory" {
		return store.NewMemory(o.Memory, onRelease), nil
	}
	return openRedis(ctx, o)
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

func openRedis(ctx context.Context, o Options) (store.Backend, error) {
	opts, err := redis.ParseURL(o.Store)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	client := redis.NewClient(opts)
	s, err := redisstore.New(ctx, redisstore.Options{Client: client, Prefix: o.Prefix, MaxMemory: o.Memory})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store %s: %w", o.Store, err)
	}
	return redisBackend{Store: s, client: client}, nil
}
