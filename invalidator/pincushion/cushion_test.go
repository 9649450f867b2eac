package pincushion

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

func at(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }

func TestThinSmall(t *testing.T) {
	now := at(10)
	if got := thin([]time.Time{at(1), at(2)}, 2, now); got != nil {
		t.Fatalf("within budget: dropped %v", got)
	}
	// Budget 1 keeps only the newest; budget 2 the oldest and the newest.
	if got := thin([]time.Time{at(1), at(2), at(3)}, 1, now); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("budget 1: dropped %v, want [0 1]", got)
	}
	if got := thin([]time.Time{at(1), at(2), at(3), at(9)}, 2, now); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("budget 2: dropped %v, want [1 2]", got)
	}
	// The pin whose removal opens the smallest hole relative to its age
	// goes: 8.9 sits between 8.8 and 9.5, a 0.7 s span at age 1.1 s; every
	// other interior pin leaves a relatively larger hole.
	if got := thin([]time.Time{at(1), at(5), at(8), at(8.8), at(8.9), at(9.5), at(10)}, 6, now); len(got) != 1 || got[0] != 4 {
		t.Fatalf("dropped %v, want [4]", got)
	}
	// Two pins taken at the same time: one of them goes.
	if got := thin([]time.Time{at(1), at(5), at(5), at(9)}, 3, now); len(got) != 1 || (got[0] != 1 && got[0] != 2) {
		t.Fatalf("dropped %v, want one of the equal pair", got)
	}
}

// TestThinSteadyState runs the policy as the cushion does (expire, add,
// thin) for three simulated minutes and checks the shape it settles in:
// full budget, the newest pin kept, the oldest near the staleness limit,
// and gaps that only widen with age, at most about half the age.
func TestThinSteadyState(t *testing.T) {
	const (
		interval  = 200 * time.Millisecond
		staleness = 60 * time.Second
		budget    = 32
	)
	var taken []time.Time
	now := at(0)
	for k := 0; k < 900; k++ {
		now = at(0).Add(time.Duration(k) * interval)
		for len(taken) > 0 && !now.Before(taken[0].Add(staleness)) {
			taken = taken[1:]
		}
		taken = append(taken, now)
		drop := thin(taken, budget, now)
		if len(drop) > 0 && drop[len(drop)-1] == len(taken)-1 {
			t.Fatalf("step %d: the newest pin was dropped", k)
		}
		keep := taken[:0]
		for i, x := range taken {
			if len(drop) > 0 && drop[0] == i {
				drop = drop[1:]
				continue
			}
			keep = append(keep, x)
		}
		taken = keep
		if len(taken) > budget {
			t.Fatalf("step %d: %d pins over budget %d", k, len(taken), budget)
		}
	}
	if len(taken) != budget {
		t.Fatalf("%d pins held, want the full budget %d", len(taken), budget)
	}
	if !taken[len(taken)-1].Equal(now) {
		t.Fatal("newest pin not kept")
	}
	if age := now.Sub(taken[0]); age < staleness*8/10 {
		t.Fatalf("oldest pin is %s old: the staleness range is not covered", age)
	}
	for i := 0; i+2 < len(taken); i++ {
		older, newer := taken[i+1].Sub(taken[i]), taken[i+2].Sub(taken[i+1])
		if older < newer {
			t.Fatalf("gap %s before pin %d is narrower than the newer gap %s", older, i+1, newer)
		}
		if ageNewer := now.Sub(taken[i+1]); older > interval+ageNewer/2 {
			t.Fatalf("gap %s before a pin %s old is too wide", older, ageNewer)
		}
	}
}

// TestReleasedPinsConnectionsAreReused: a candidate's connection, once its
// pin is released, carries the next candidate (one PostgreSQL backend
// rather than one per candidate), in a new transaction that sees what
// committed in between; one the server ended is replaced.
func TestReleasedPinsConnectionsAreReused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := testenv.Database(t, env.PG)
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE TABLE seen (id int)"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := New(Config{ConnString: dbURL, Metrics: reg}, NewCommitLog(0))
	if err != nil {
		t.Fatal(err)
	}
	c.running.Store(true)
	defer c.closeAll()
	pids := map[uint32]bool{}
	for i := range 20 {
		conn, tx, err := c.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM seen").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != i {
			t.Fatalf("candidate %d sees %d rows, want %d: not a new transaction", i, n, i)
		}
		pids[conn.PgConn().PID()] = true
		c.putBack(tx, conn)
		if _, err := admin.Exec(ctx, "INSERT INTO seen VALUES (1)"); err != nil {
			t.Fatal(err)
		}
	}
	if len(pids) != 1 {
		t.Errorf("20 candidates in turn used %d backends, want 1", len(pids))
	}
	// The server ends the idle connection: the next candidate gets a new one.
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'larder-pincushion'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the backend exits
	conn, tx, err := c.begin(ctx)
	if err != nil {
		t.Fatalf("after the server ended the idle connection: %v", err)
	}
	if pids[conn.PgConn().PID()] {
		t.Error("the ended connection was used again")
	}
	c.putBack(tx, conn)
	if o, r := testutil.ToFloat64(c.m.conns.WithLabelValues("opened")), testutil.ToFloat64(c.m.conns.WithLabelValues("reused")); o != 2 || r != 19 {
		t.Errorf("connections opened %v, reused %v; want 2 and 19", o, r)
	}
}
