package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/service"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true, Redis: true}, &env))
}

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure-no-auth", "--memory", "lots"}, "--memory"},
		{[]string{"--insecure-no-auth", "--store", "mysql://x"}, "--store"},
		{[]string{"--insecure-no-auth", "--prefix", "a b"}, "prefix"},
		{[]string{"--insecure-no-auth", "x"}, "unexpected"},
		{[]string{"--insecure-no-auth", "--max-conns", "0"}, "--max-conns"},
		{[]string{"--insecure-no-auth", "--max-in-flight", "lots"}, "--max-in-flight"},
		{[]string{"--insecure-no-auth", "--idle-timeout", "0s"}, "--idle-timeout"},
	} {
		var out bytes.Buffer
		if code := run(c.args, &out); code != 2 || !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: exit %d %q", c.args, code, out.String())
		}
	}
	if n, err := parseBytes("3MiB"); err != nil || n != 3<<20 {
		t.Errorf("3MiB = %d %v", n, err)
	}
}

// TestEndToEnd runs PostgreSQL, the invalidator with its pincushion, and a
// cache-node daemon (memory, then Redis): a result computed at a pin is
// served at that pin, and an UPDATE of the row ends it at the UPDATE's
// commit LSN. With Redis, an UPDATE made while the node is down is not
// seen by the restarted node, which therefore must not serve the version
// past the watermark it saved.
func TestEndToEnd(t *testing.T) {
	t.Run("memory", func(t *testing.T) { endToEnd(t, "memory") })
	t.Run("redis", func(t *testing.T) { endToEnd(t, env.Redis.URL()) })
}

func endToEnd(t *testing.T, storeURL string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := testenv.Database(t, env.PG)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY, name text); ALTER TABLE items REPLICA IDENTITY FULL; INSERT INTO items VALUES (1, 'pen'), (2, 'cap')`); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("e2e%d", e2eSeq.Add(1))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	o := service.Defaults()
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication, o.Metrics = url, env.NATS.URL(), prefix, prefix, prefix, ""
	o.Heartbeat, o.PinInterval = 20*time.Millisecond, 100*time.Millisecond
	invDone := make(chan error, 1)
	go func() { invDone <- service.Run(ctx, o, quiet) }()
	defer func() { cancel(); <-invDone }()

	startNode := func() (*protocol.Client, func()) {
		nctx, ncancel := context.WithCancel(ctx)
		ready := make(chan string, 1)
		done := make(chan error, 1)
		go func() {
			done <- daemon.Run(nctx, daemon.Options{Listen: "127.0.0.1:0", NATS: env.NATS.URL(), Prefix: prefix, Store: storeURL, Memory: 64 << 20, MaxFrame: protocol.DefaultMaxFrame}, quiet, ready)
		}()
		var addr string
		select {
		case addr = <-ready:
		case err := <-done:
			t.Fatalf("node: %v", err)
		}
		cl := protocol.NewClient(addr, 2)
		return cl, func() {
			cl.Close()
			ncancel()
			if err := <-done; err != nil {
				t.Errorf("node: %v", err)
			}
		}
	}
	cl, stopNode := startNode()
	defer func() { stopNode() }()

	// A pin from the pincushion.
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var pin invalidation.Pin
	for deadline := time.Now().Add(60 * time.Second); pin.SnapshotID == ""; {
		if time.Now().After(deadline) {
			t.Fatal("no pin")
		}
		if reply, err := nc.Request(invalidation.PinListSubject(prefix), nil, time.Second); err == nil {
			if pins, err := invalidation.DecodePinList(reply.Data); err == nil && len(pins) > 0 {
				pin = pins[len(pins)-1]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The result at the pin.
	var name string
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+pin.SnapshotID+"'"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT name FROM items WHERE id = 1").Scan(&name)
	})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("items-1-name")
	dep := store.Dep{Tag: "public.items(id)=1", Table: "public.items", Reads: []string{"id", "name"}}
	if err := cl.Put(ctx, &protocol.PutRequest{Key: key, Snapshot: pin.LSN, Deps: []store.Dep{dep}, Value: []byte(name)}); err != nil {
		t.Fatal(err)
	}
	// A second result, on another row, that the update below misses.
	key2 := []byte("items-2-name")
	dep2 := store.Dep{Tag: "public.items(id)=2", Table: "public.items", Reads: []string{"id", "name"}}
	if err := cl.Put(ctx, &protocol.PutRequest{Key: key2, Snapshot: pin.LSN, Deps: []store.Dep{dep2}, Value: []byte("cap")}); err != nil {
		t.Fatal(err)
	}
	r := protocol.LookupResponse{Miss: store.MissCompulsory}
	for deadline := time.Now().Add(30 * time.Second); r.Miss != store.Hit; {
		if time.Now().After(deadline) {
			t.Fatalf("the put was never served: %+v", r)
		}
		if r, err = cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: pin.LSN, TMax: pin.LSN}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if string(r.Value) != "pen" || !r.Open {
		t.Fatalf("served %+v", r)
	}

	update := func(to string) pglogrepl.LSN {
		if _, err := conn.Exec(ctx, "UPDATE items SET name = $1 WHERE id = 1", to); err != nil {
			t.Fatal(err)
		}
		var walText string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walText); err != nil {
			t.Fatal(err)
		}
		wal, _ := pglogrepl.ParseLSN(walText)
		return wal
	}
	waitWatermark := func(cl *protocol.Client, wal pglogrepl.LSN) {
		for deadline := time.Now().Add(30 * time.Second); ; {
			st, err := cl.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Watermark >= uint64(wal) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("watermark %X never reached %s", st.Watermark, wal)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	if storeURL != "memory" {
		// The node stops; the row changes while it is away; a new node on
		// the same Redis must not serve the version past what it saved.
		for deadline := time.Now().Add(30 * time.Second); ; {
			r, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key2, TMin: pin.LSN, TMax: pin.LSN})
			if err != nil {
				t.Fatal(err)
			}
			if r.Miss == store.Hit {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the second put was never served: %+v", r)
			}
			time.Sleep(5 * time.Millisecond)
		}
		stopNode()
		wal := update("away")
		cl, stopNode = startNode()
		waitWatermark(cl, wal)
		if r, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: uint64(wal), TMax: uint64(wal) + 1000}); err != nil || r.Miss == store.Hit {
			t.Fatalf("after a restart, served past the change made while the node was down: %+v %v", r, err)
		}
		if r, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: pin.LSN, TMax: pin.LSN}); err != nil || r.Miss != store.Hit || r.Open || r.Hi > uint64(wal) {
			t.Fatalf("after a restart, at the pin: %+v %v", r, err)
		}
		// The restarted node replayed what it missed: the other row's
		// result is still valid, and served past the update.
		if r, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key2, TMin: uint64(wal), TMax: uint64(wal) + 1000}); err != nil || r.Miss != store.Hit || !r.Open {
			t.Fatalf("after a restart, the result the update missed: %+v %v", r, err)
		}
		return
	}

	// An UPDATE by any client ends it.
	wal := update("ink")
	waitWatermark(cl, wal)
	r, err = cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: pin.LSN, TMax: pin.LSN})
	if err != nil || r.Miss != store.Hit || r.Open || r.Hi > uint64(wal) || r.Hi <= pin.LSN {
		t.Fatalf("after the update: %+v %v (pin %X, WAL %s)", r, err, pin.LSN, wal)
	}
	r, err = cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: uint64(wal), TMax: uint64(wal) + 1000})
	if err != nil || r.Miss == store.Hit {
		t.Fatalf("served after the update: %+v %v", r, err)
	}
}

var e2eSeq atomic.Int64
