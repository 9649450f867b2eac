package service

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/internal/testenv"
)

// A tag column set registered at run time: refused while the table's
// replica identity cannot give its old values (with the fix in the
// reason), then published for every commit after its effective LSN and
// for none before, announced by an epoch at that LSN, listed with it in
// the tag sets reply, and still published after the invalidator restarts.
func TestRegisteredTagSetIsPublishedFromItsEffectiveLSN(t *testing.T) {
	url := testenv.Database(t, env.PG)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `
CREATE TABLE bids (id int PRIMARY KEY, item_id int, amount int);
INSERT INTO bids SELECT g, g % 10, 0 FROM generate_series(1, 50) g;`); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const prefix = "reg"
	tag := tags.Tag{Table: "public.bids", Columns: []string{"item_id"}, Values: []string{"7"}}.String()
	onTag, err := nc.SubscribeSync(invalidation.TagSubject(prefix, tag))
	if err != nil {
		t.Fatal(err)
	}
	epochs, err := nc.SubscribeSync(invalidation.EpochSubject(prefix))
	if err != nil {
		t.Fatal(err)
	}
	hb, err := nc.SubscribeSync(invalidation.HeartbeatSubject(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	start := func() (stop func()) {
		o := Defaults()
		o.PG, o.NATS, o.Prefix = url, env.NATS.URL(), prefix
		o.Slot, o.Publication = "reg", "reg"
		o.Heartbeat = 20 * time.Millisecond
		o.StreamMemory, o.Metrics, o.Pins = true, "", false
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, o, slog.New(slog.NewTextHandler(testWriter{t}, nil))) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("service: %v", err)
			}
		}
	}
	register := func() invalidation.TagSetsRegistered {
		t.Helper()
		b, _ := json.Marshal(invalidation.TagSetsRegistration{Sets: map[string][][]string{"public.bids": {{"item_id"}}, "public.nowhere": {{"id"}}}})
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			m, err := nc.Request(invalidation.TagSetsRegisterSubject(prefix), b, 35*time.Second)
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			var out invalidation.TagSetsRegistered
			if err := json.Unmarshal(m.Data, &out); err != nil {
				t.Fatalf("answer %q: %v", m.Data, err)
			}
			if strings.Contains(out.Error, "not replicating yet") {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return out
		}
		t.Fatal("no answer to the registration within a minute")
		return invalidation.TagSetsRegistered{}
	}
	waitHeartbeat := func() {
		t.Helper()
		if _, err := hb.NextMsg(60 * time.Second); err != nil {
			t.Fatalf("no heartbeat: %v", err)
		}
	}

	stop := start()
	defer func() { stop() }()
	set := invalidation.SetName("public.bids", []string{"item_id"})

	// The primary key is the identity: item_id's old values are unknown.
	out := register()
	if out.Error != "" || out.Effective != 0 || !strings.Contains(out.Refused[set], "REPLICA IDENTITY FULL") ||
		!strings.Contains(out.Refused[invalidation.SetName("public.nowhere", []string{"id"})], "not covered") {
		t.Fatalf("registration with the default identity: %+v", out)
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE bids REPLICA IDENTITY FULL"); err != nil {
		t.Fatal(err)
	}
	var before pglogrepl.LSN
	if err := conn.QueryRow(ctx, "UPDATE bids SET amount = 1 WHERE id = 7 RETURNING pg_current_wal_insert_lsn()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	out = register()
	if out.Error != "" || out.Effective == 0 || len(out.Refused) != 1 || out.Reply == nil {
		t.Fatalf("registration with identity FULL: %+v", out)
	}
	if out.Effective <= uint64(before) {
		t.Fatalf("effective LSN %X is not after an update committed before the registration (%s)", out.Effective, before)
	}
	if got := out.Reply.From[set]; got != out.Effective {
		t.Fatalf("reply's effective LSN of %s = %X, want %X", set, got, out.Effective)
	}
	if !containsSet(out.Reply.Tables["public.bids"], []string{"item_id"}) {
		t.Fatalf("reply does not list the set: %v", out.Reply.Tables)
	}
	// The epoch at the effective LSN (after the session's own epoch).
	var sawEpoch bool
	for !sawEpoch {
		m, err := epochs.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no epoch at the effective LSN %X: %v", out.Effective, err)
		}
		d, err := invalidation.Decode(m.Data)
		if err != nil || d.Txn == nil {
			t.Fatalf("epoch message: %v", err)
		}
		sawEpoch = d.Txn.CommitLSN == out.Effective
	}
	// Nothing was published on the set's subject before.
	waitHeartbeat()
	if m, err := onTag.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("a message on %s before anything changed after the registration: %q", tag, m.Data)
	}
	// A change after: published under the set, with a commit LSN after
	// the effective one.
	if _, err := conn.Exec(ctx, "UPDATE bids SET amount = 2 WHERE id = 17"); err != nil {
		t.Fatal(err)
	}
	m, err := onTag.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no message on %s after an update of item 7's bid: %v", tag, err)
	}
	d, err := invalidation.Decode(m.Data)
	if err != nil || d.Txn == nil || d.Txn.CommitLSN <= out.Effective {
		t.Fatalf("message on %s: %+v, %v", tag, d.Txn, err)
	}

	// Restarted, the invalidator still publishes the set, with the same
	// effective LSN, and registering it again changes nothing.
	stop()
	stop = start()
	again := register()
	if again.Error != "" || again.Effective != 0 || again.Reply == nil || again.Reply.From[set] != out.Effective {
		t.Fatalf("after a restart: %+v (want the set published from %X)", again, out.Effective)
	}
	if _, err := conn.Exec(ctx, "UPDATE bids SET amount = 3 WHERE id = 27"); err != nil {
		t.Fatal(err)
	}
	if _, err := onTag.NextMsg(30 * time.Second); err != nil {
		t.Fatalf("after a restart, no message on %s after an update of item 7's bid: %v", tag, err)
	}
}

func containsSet(sets [][]string, set []string) bool {
	for _, s := range sets {
		if strings.Join(s, ",") == strings.Join(set, ",") {
			return true
		}
	}
	return false
}
