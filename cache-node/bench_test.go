package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/redisstore"
	"github.com/larderdb/larder/cache-node/store"
)

// BenchmarkRemoteLookupHit: a lookup hit through the protocol over TCP
// (client → server → node → memory backend) against a plain Redis GET of
// the same payload over go-redis, in the same run.
func BenchmarkRemoteLookupHit(b *testing.B) {
	ctx := context.Background()
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	mem := store.NewMemory(1<<30, nil)
	n, err := node.New(node.Config{NATS: nc, Prefix: "bench", Backend: mem, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := &protocol.Server{Handler: n.Handler(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	go func() { _ = srv.Serve(sctx, ln) }()
	cl := protocol.NewClient(ln.Addr().String(), 4)
	defer cl.Close()

	opts, err := redis.ParseURL(env.Redis.URL())
	if err != nil {
		b.Fatal(err)
	}
	rc := redis.NewClient(opts)
	defer rc.Close()

	// The same node in front of the Redis backend.
	rs, err := redisstore.New(ctx, redisstore.Options{Client: rc, Prefix: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	rn, err := node.New(node.Config{NATS: nc, Prefix: "bench", Backend: rs, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	rln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	rsrv := &protocol.Server{Handler: rn.Handler(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	go func() { _ = rsrv.Serve(sctx, rln) }()
	rcl := protocol.NewClient(rln.Addr().String(), 4)
	defer rcl.Close()

	for _, size := range []int{1 << 10, 16 << 10} {
		val := make([]byte, size)
		key := []byte(fmt.Sprintf("bench-%d", size))
		// A version valid at 0 while the node's watermark is 0.
		if err := mem.Put(ctx, key, &store.Version{Lo: 0, Hi: store.Open, Snapshot: 0, Deps: []store.Dep{{Tag: "public.t(id)=1", Table: "public.t", Reads: []string{"v"}}}, Value: val}); err != nil {
			b.Fatal(err)
		}
		if err := rc.Set(ctx, string(key), val, 0).Err(); err != nil {
			b.Fatal(err)
		}
		if err := rs.Put(ctx, key, &store.Version{Lo: 0, Hi: store.Open, Snapshot: 0, Deps: []store.Dep{{Tag: "public.t(id)=1", Table: "public.t", Reads: []string{"v"}}}, Value: val}); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("node-redis/%dKiB", size>>10), func(b *testing.B) {
			q := &protocol.LookupRequest{Key: key, TMin: 0, TMax: 0}
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				r, err := rcl.Lookup(ctx, q)
				if err != nil || r.Miss != store.Hit || len(r.Value) != size {
					b.Fatalf("lookup: %+v %v", r.Miss, err)
				}
			}
		})
		b.Run(fmt.Sprintf("node-memory/%dKiB", size>>10), func(b *testing.B) {
			q := &protocol.LookupRequest{Key: key, TMin: 0, TMax: 0}
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				r, err := cl.Lookup(ctx, q)
				if err != nil || r.Miss != store.Hit || len(r.Value) != size {
					b.Fatalf("lookup: %+v %v", r.Miss, err)
				}
			}
		})
		b.Run(fmt.Sprintf("redis-GET/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				v, err := rc.Get(ctx, string(key)).Bytes()
				if err != nil || len(v) != size {
					b.Fatalf("get: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("node-memory-parallel/%dKiB", size>>10), func(b *testing.B) {
			q := &protocol.LookupRequest{Key: key, TMin: 0, TMax: 0}
			b.SetBytes(int64(size))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r, err := cl.Lookup(ctx, q); err != nil || r.Miss != store.Hit {
						b.Errorf("lookup: %v", err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("redis-GET-parallel/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := rc.Get(ctx, string(key)).Err(); err != nil {
						b.Errorf("get: %v", err)
						return
					}
				}
			})
		})
	}
}
