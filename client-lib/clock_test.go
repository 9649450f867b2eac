package larder

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const clockDDL = `CREATE TABLE events (id int PRIMARY KEY, at timestamptz NOT NULL);
ALTER TABLE events REPLICA IDENTITY FULL;`

const upcoming = "SELECT id FROM events WHERE at >= now() ORDER BY id"

// A query reading now() is cached per clock bucket: it sees now() as the
// transaction's start rounded down to the granularity (here a day: UTC
// midnight), a second read is a hit, and with clock buckets off it runs
// uncached with PostgreSQL's own now().
func TestClockBoundQueryIsCachedPerBucket(t *testing.T) {
	day := 24 * time.Hour
	midnight := clockBucket(time.Now(), day)
	if time.Since(midnight) < 5*time.Second {
		time.Sleep(5 * time.Second) // the row below must lie between the bucket and now
		midnight = clockBucket(time.Now(), day)
	}
	// Event 1 is after midnight but already past: in the bucket's view of
	// "now" it is upcoming, in PostgreSQL's it is not. Event 2 is
	// upcoming in both; event 3 was before midnight.
	seed := "INSERT INTO events VALUES (1, '" + midnight.Add(time.Second).Format(time.RFC3339) + "'), (2, now() + interval '1 hour'), (3, '" + midnight.Add(-time.Hour).Format(time.RFC3339) + "')"
	s := startStackWith(t, clockDDL, seed, upcoming)
	c := s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.ClockGranularity = day })
	ctx := context.Background()
	read := func(c *Client) []int {
		t.Helper()
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		rows, err := tx.Query(ctx, upcoming)
		if err != nil {
			t.Fatal(err)
		}
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
	if got := read(c); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("with now() = %s (the day's bucket): events %v, want [1 2]", midnight, got)
	}
	c.puts.Wait()
	// Later reads in the same bucket are hits (once the node confirmed
	// the entry's groups).
	for deadline := time.Now().Add(30 * time.Second); c.stats.NodeHits.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no cache-node hit in the same bucket")
		}
		if got := read(c); len(got) != 2 || got[0] != 1 || got[1] != 2 {
			t.Fatalf("a later read: %v", got)
		}
	}

	// Per template: the database read and the node hits, under its id.
	tpl, err := c.keying.Load().analyzer(c.poolScope.Load().path).Prepare(upcoming)
	if err != nil {
		t.Fatal(err)
	}
	if db, hit := testutil.ToFloat64(c.m.templateReads.WithLabelValues(tpl.ID, "database")), testutil.ToFloat64(c.m.templateReads.WithLabelValues(tpl.ID, "node")); db < 1 || hit < 1 {
		t.Errorf("template reads of %s: %v from the database, %v from the node", tpl.ID, db, hit)
	}

	off := s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.ClockGranularity = -1 })
	if got := read(off); len(got) != 1 || got[0] != 2 {
		t.Fatalf("clock buckets off (PostgreSQL's now()): events %v, want [2]", got)
	}
	if got := testutil.ToFloat64(off.m.uncached.WithLabelValues("reads the clock (clock buckets off)")); got != 1 {
		t.Errorf("uncacheable reads with clock buckets off: %v, want 1", got)
	}
}

func TestClockBucket(t *testing.T) {
	at := time.Date(2026, 11, 24, 7, 41, 13, 500, time.FixedZone("x", 3600))
	for _, c := range []struct {
		g    time.Duration
		want string
	}{
		{time.Minute, "2026-11-24T06:41:00Z"},
		{time.Hour, "2026-11-24T06:00:00Z"},
		{24 * time.Hour, "2026-11-24T00:00:00Z"},
		{7 * time.Second, time.Unix(at.Unix()-at.Unix()%7, 0).UTC().Format(time.RFC3339)},
	} {
		if got := clockBucket(at, c.g).Format(time.RFC3339Nano); got != c.want {
			t.Errorf("clockBucket(%s, %s) = %s, want %s", at, c.g, got, c.want)
		}
	}
	if b := clockBucket(time.Unix(-5, 0), 10*time.Second); b.Unix() != -10 {
		t.Errorf("before the epoch: %v", b.Unix())
	}
}
