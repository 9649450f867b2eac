package overlay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// BenchmarkRemoteHit compares, on loopback, a client's lookup hit of a key
// (512-byte value) answered by its master over the cache-node protocol
// (direct), the same lookup sent to another member that forwards it to the
// master over a libp2p stream (remote), and one TCP round trip of a frame
// of that size (round-trip): the bound is remote ≤ direct + one
// round trip + 50 µs. Plain TCP for the client's connections (TLS costs
// both paths alike).
func BenchmarkRemoteHit(b *testing.B) {
	c := newCluster(b, 2)
	master := newRecordingHandler("master")
	o0, err := Start(context.Background(), c.config(0, master, nil))
	if err != nil {
		b.Fatal(err)
	}
	defer o0.Close()
	o1, err := Start(context.Background(), c.config(1, newRecordingHandler("home"), o0))
	if err != nil {
		b.Fatal(err)
	}
	defer o1.Close()
	want := slices.Sorted(slices.Values(c.ids))
	for deadline := time.Now().Add(convergence); !slices.Equal(o1.Members(), want) || !slices.Equal(o0.Members(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("no convergence")
		}
	}
	var key []byte
	for _, k := range testKeys(1000) {
		if o1.Master(k) == o0.ID() && o0.Master(k) == o0.ID() {
			key = k
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serve := func(h protocol.Handler) *protocol.Client {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &protocol.Server{Handler: h, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		go func() { _ = srv.Serve(ctx, ln) }()
		return protocol.NewClient(ln.Addr().String(), 2)
	}
	direct := serve(o0.Handler())
	defer direct.Close()
	remote := serve(o1.Handler())
	defer remote.Close()
	if err := direct.Put(ctx, &protocol.PutRequest{Key: key, Snapshot: 1, Value: make([]byte, 512)}); err != nil {
		b.Fatal(err)
	}
	q := &protocol.LookupRequest{Key: key, TMin: 1, TMax: 2}
	lookup := func(cl *protocol.Client) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				r, err := cl.Lookup(ctx, q)
				if err != nil || r.Miss != store.Hit {
					b.Fatalf("lookup: %v %v", r.Miss, err)
				}
			}
		}
	}
	b.Run("direct", lookup(direct))
	b.Run("remote", lookup(remote))
	b.Run("round-trip", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = io.Copy(conn, conn)
		}()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		buf := make([]byte, 600)
		for b.Loop() {
			if _, err := conn.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(conn, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
