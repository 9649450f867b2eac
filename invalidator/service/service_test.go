package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/publisher"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

// The tag sets reply names exactly the tables the invalidator publishes
// (with [] for a table without tag column sets), and follows schema
// changes, each announced on p.schema.changed.
func TestTagSetsReplyIsTheCoverage(t *testing.T) {
	url := testenv.Database(t, env.PG)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `
CREATE TABLE items (id int PRIMARY KEY, name text);
CREATE TABLE logs (msg text);
ALTER TABLE logs REPLICA IDENTITY FULL;
CREATE TABLE notes (id int PRIMARY KEY, body text);`); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	notices := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe("cov.schema.changed", notices)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	o := Defaults()
	o.PG, o.NATS, o.Prefix = url, env.NATS.URL(), "cov"
	o.Slot, o.Publication = "cov", "cov"
	o.Tables = []string{"public.items", "public.logs"}
	o.Heartbeat = 20 * time.Millisecond
	o.StreamMemory, o.Metrics, o.Pins = true, "", false
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, o, slog.New(slog.NewTextHandler(testWriter{t}, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	}()

	ask := func() map[string][][]string {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			m, err := nc.Request("cov.config.tagsets", nil, time.Second)
			if err == nil {
				reply, err := invalidation.DecodeTagSetsReply(m.Data)
				if err != nil {
					t.Fatalf("reply %q: %v", m.Data, err)
				}
				if len(reply.From) != 0 {
					t.Fatalf("reply %q: effective LSNs without registrations", m.Data)
				}
				return reply.Tables
			}
			select {
			case err := <-done:
				t.Fatalf("service stopped: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		t.Fatal("no tag sets reply within a minute")
		return nil
	}
	notice := func(what string) {
		t.Helper()
		select {
		case m := <-notices:
			var n struct {
				CommitLSN uint64 `json:"commit_lsn"`
			}
			if err := json.Unmarshal(m.Data, &n); err != nil || n.CommitLSN == 0 {
				t.Fatalf("%s: notice %q (%v)", what, m.Data, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: no notice on cov.schema.changed", what)
		}
	}

	want := map[string][][]string{"public.items": {{"id"}}, "public.logs": {}}
	if got := ask(); !reflect.DeepEqual(got, want) {
		t.Fatalf("tag sets reply with --tables items,logs:\n got %v\nwant %v", got, want)
	}
	// Replicating (the reply comes first) once a heartbeat is published.
	hb, err := nc.SubscribeSync("cov.hb")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hb.NextMsg(60 * time.Second); err != nil {
		t.Fatalf("no heartbeat: %v", err)
	}
	_ = hb.Unsubscribe()
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION cov ADD TABLE notes"); err != nil {
		t.Fatal(err)
	}
	notice("ALTER PUBLICATION")
	want["public.notes"] = [][]string{{"id"}}
	if got := ask(); !reflect.DeepEqual(got, want) {
		t.Errorf("after ADD TABLE notes:\n got %v\nwant %v", got, want)
	}
	if _, err := conn.Exec(ctx, "DROP TABLE logs"); err != nil {
		t.Fatal(err)
	}
	notice("DROP TABLE")
	delete(want, "public.logs")
	if got := ask(); !reflect.DeepEqual(got, want) {
		t.Errorf("after DROP TABLE logs:\n got %v\nwant %v", got, want)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Event triggers that cannot be installed stop the invalidator (exit 2),
// like a refused replica identity.
func TestDDLTriggerErrorIsConfig(t *testing.T) {
	if !IsConfig(fmt.Errorf("start: %w", &publisher.DDLTriggerError{Err: errors.New("permission denied")})) {
		t.Error("a DDLTriggerError is not a configuration error")
	}
}
