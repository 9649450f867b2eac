package larder

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/qumaana/quma"
)

const byVer = "SELECT id FROM accounts WHERE ver = $1"

// waitKeyedOn waits until c keys sql on a set (not the table tag).
func waitKeyedOn(t *testing.T, c *Client, sql string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !keyedOn(t, c, sql); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is not keyed on a tag column set 60 s after the start", sql)
		}
	}
}

// A client whose QUMA file keys a query on a set the invalidator does not
// publish registers it; from its effective LSN on, results are keyed on
// it: a change to another key leaves them valid (a hit), a change to
// their own key ends them.
func TestRegisteredTagSetKeysResults(t *testing.T) {
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance, ver) VALUES (1, 100, 1), (2, 100, 2), (3, 100, 3)", readBalance, byVer)
	c := s.openWith(t, []string{s.node}, 0, true, waitForPlacement) // reads right after writes hit
	ctx := context.Background()
	waitKeyedOn(t, c, byVer)
	set := invalidation.SetName("public.accounts", []string{"ver"})
	from := c.keying.Load().from[set]
	if from == 0 {
		t.Fatalf("keyed on %s without its effective LSN", set)
	}
	if got := testutil.ToFloat64(c.m.registrations.WithLabelValues("registered")); got != 1 {
		t.Errorf("registered sets = %v, want 1", got)
	}
	read := func() []int {
		t.Helper()
		tx, err := c.BeginRO(ctx, time.Nanosecond) // a fresh snapshot
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		if tx.Timestamp() != 0 && tx.Timestamp() < from {
			t.Fatalf("a fresh transaction at %X, before the set's effective LSN %X", tx.Timestamp(), from)
		}
		rows, err := tx.Query(ctx, byVer, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []int
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	if ids := read(); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("ver = 1: %v", ids)
	}
	c.puts.Wait()
	// Another key's change: the result keyed on ver = 1 stays valid.
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = 7 WHERE id = 3"); err != nil {
		t.Fatal(err)
	}
	hits := c.stats.NodeHits.Load()
	for deadline := time.Now().Add(30 * time.Second); c.stats.NodeHits.Load() == hits; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no cache-node hit for ver = 1 after a change to the row of ver = 3: not keyed on accounts(ver)")
		}
		if ids := read(); len(ids) != 1 || ids[0] != 1 {
			t.Fatalf("ver = 1 after a change elsewhere: %v", ids)
		}
	}
	// Its own key's change ends it.
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET ver = 9 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if ids := read(); len(ids) != 0 {
		t.Fatalf("ver = 1 after row 1 moved to ver 9 (fresh snapshot): %v", ids)
	}
}

// A transaction whose snapshot precedes a set's effective LSN does not put
// results keyed on it on the cache-node: changes between the two were not
// published under the set.
func TestNoNodePutKeyedOnASetRegisteredAfterTheSnapshot(t *testing.T) {
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance, ver) VALUES (1, 100, 1), (2, 100, 2)", readBalance, byVer)
	reader := s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.NoRegisterTagSets = true })
	ctx := context.Background()
	tx, err := reader.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit(ctx)
	var b int
	if err := tx.QueryRow(ctx, readBalance, []any{2}, &b); err != nil {
		t.Fatal(err)
	}
	if keyedOn(t, reader, byVer) {
		t.Fatal("keyed on accounts(ver) before anyone registered it")
	}
	// Another client registers the set; the reader hears of it.
	s.openWith(t, []string{s.node}, 0, true, nil)
	waitKeyedOn(t, reader, byVer)
	from := reader.keying.Load().from[invalidation.SetName("public.accounts", []string{"ver"})]
	if tx.Timestamp() == 0 || tx.Timestamp() >= from {
		t.Fatalf("the transaction's snapshot %X is not before the effective LSN %X", tx.Timestamp(), from)
	}
	var id int
	if err := tx.QueryRow(ctx, byVer, []any{1}, &id); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(reader.m.earlyPuts); got != 1 {
		t.Fatalf("results kept off the node as keyed on a set younger than their snapshot: %v, want 1", got)
	}
}

// publishedAt: a keyed tag of a registered set is published from its
// effective LSN on; table tags and the sets the invalidator started with
// always.
func TestPublishedAt(t *testing.T) {
	k := &keying{from: map[string]uint64{"public.bids(item_id)": 100}}
	bid := quma.QueryTag{Tag: tags.Tag{Table: "public.bids", Columns: []string{"item_id"}, Values: []string{"7"}}}
	item := quma.QueryTag{Tag: tags.Tag{Table: "public.items", Columns: []string{"id"}, Values: []string{"7"}}}
	table := quma.QueryTag{Tag: tags.TableTag("public.bids")}
	for _, c := range []struct {
		qtags []quma.QueryTag
		ts    uint64
		want  bool
	}{
		{[]quma.QueryTag{bid}, 99, false},
		{[]quma.QueryTag{bid}, 100, true},
		{[]quma.QueryTag{item, bid}, 50, false},
		{[]quma.QueryTag{item, table}, 50, true},
	} {
		if got := k.publishedAt(c.qtags, c.ts); got != c.want {
			t.Errorf("publishedAt(%v, %d) = %v, want %v", c.qtags, c.ts, got, c.want)
		}
	}
	if !(&keying{}).publishedAt([]quma.QueryTag{bid}, 1) {
		t.Error("no registered sets: every set is published")
	}
}

// A registration that fails (here the invalidator answers that it is not
// replicating yet, as it does while it starts) is tried again, with a
// pause, until it is answered; it used to wait for the next reload of the
// keying, which an unchanged invalidator never caused, so results kept the
// table tag.
func TestTagSetRegistrationRetriedAfterAFailure(t *testing.T) {
	defer func(b time.Duration) { registerBackoff = b }(registerBackoff)
	registerBackoff = 50 * time.Millisecond
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance, ver) VALUES (1, 100, 1)", readBalance, byVer)
	// An invalidator that publishes accounts(id) only, and refuses the
	// first two registrations as one starting up does.
	nc, err := nats.Connect(s.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reply := &invalidation.TagSetsReply{Tables: map[string][][]string{"public.accounts": {{"id"}}}}
	if _, err := nc.Subscribe(invalidation.TagSetsSubject(s.prefix), func(m *nats.Msg) { _ = m.Respond(reply.Marshal()) }); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	var askedFor atomic.Value
	if _, err := nc.Subscribe(invalidation.TagSetsRegisterSubject(s.prefix), func(m *nats.Msg) {
		var out invalidation.TagSetsRegistered
		if asked.Add(1) <= 2 {
			out.Error = "publisher: not replicating yet; ask again"
		} else {
			req, err := invalidation.DecodeTagSetsRegistration(m.Data)
			if err != nil {
				t.Error(err)
			}
			askedFor.Store(req.Sets)
			out.Effective = 0x1000
		}
		b, _ := json.Marshal(&out)
		_ = m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := s.openWith(t, nil, 0, false, nil)
	for deadline := time.Now().Add(30 * time.Second); testutil.ToFloat64(c.m.registrations.WithLabelValues("registered")) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not registered 30 s after %d attempts (failed %v)", asked.Load(), testutil.ToFloat64(c.m.registrations.WithLabelValues("failed")))
		}
	}
	if n, failed := asked.Load(), testutil.ToFloat64(c.m.registrations.WithLabelValues("failed")); n != 3 || failed != 2 {
		t.Errorf("%d attempts, %v counted failed; want 3 and 2", n, failed)
	}
	if sets, _ := askedFor.Load().(map[string][][]string); len(sets["public.accounts"]) != 1 || !slices.Equal(sets["public.accounts"][0], []string{"ver"}) {
		t.Errorf("registered %v, want public.accounts(ver)", sets)
	}
}
