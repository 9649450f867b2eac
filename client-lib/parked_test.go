package larder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/history"
	"github.com/larderdb/larder/internal/invalidation"
)

// parkedRun: the readers' misses begin on the transaction a miss before
// them parked at the same pin (parked.go) when there is one. The default
// faults restart the invalidator (dropping every pin) under parked
// transactions.
func parkedRun(t *testing.T) historyRun {
	return historyRun{client: func(t *testing.T, s *stack, l1 int64) *Client {
		c := s.client(t, l1)
		t.Cleanup(func() { // before the client closes
			if n := testutil.ToFloat64(c.m.parked.WithLabelValues("taken")); n == 0 {
				t.Error("no transaction began on a parked one: parking went unchecked")
			} else {
				t.Logf("%v transactions began on a parked one", n)
			}
		})
		return c
	}}
}

// readSetting reads the transaction setting larder.test (” when unset)
// in a read-only transaction of c.
func readSetting(t *testing.T, ctx context.Context, c *Client) string {
	t.Helper()
	tx, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit(ctx)
	var v string
	if err := tx.QueryRow(ctx, "SELECT coalesce(current_setting('larder.test', true), '')", nil, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestParkedTransactionLeavesNothingBehind: a transaction that ran a
// statement other than a cacheable read (here set_config, local to the
// transaction) does not park, so the next transaction at its pin does not
// see its setting. The first half shows that a transaction that only read
// does park and the next one begins on it, so the second half's check
// can fail.
func TestParkedTransactionLeavesNothingBehind(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 0)
	ctx := context.Background()
	taken := c.m.parked.WithLabelValues("taken")
	for try := 0; testutil.ToFloat64(taken) == 0; try++ {
		if try == 50 {
			t.Fatal("in 50 tries, no transaction began on the one before it, parked at the same pin")
		}
		if got := readInt(t, ctx, c, 0, readBalance, 1); got != 100 {
			t.Fatalf("balance %d, want 100", got)
		}
		if v := readSetting(t, ctx, c); v != "" {
			t.Fatalf("larder.test = %q before anything set it", v)
		}
	}
	before := testutil.ToFloat64(c.m.parked.WithLabelValues("parked"))
	for try := 0; try < 20; try++ {
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var set string
		if err := tx.QueryRow(ctx, "SELECT set_config('larder.test', 'leaked', true)", nil, &set); err != nil {
			t.Fatal(err)
		}
		var bal int
		if err := tx.QueryRow(ctx, readBalance, []any{1}, &bal); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if v := readSetting(t, ctx, c); v != "" {
			t.Fatalf("try %d: the next transaction sees larder.test = %q, set in the one before", try, v)
		}
	}
	if n := testutil.ToFloat64(c.m.parked.WithLabelValues("parked")) - before; n != 0 {
		t.Fatalf("%v transactions that ran set_config parked", n)
	}
}

// TestParkedTransactionLetsLocksThrough: a parked transaction holds its
// tables' ACCESS SHARE locks only until it expires (ParkIdle): an ACCESS
// EXCLUSIVE lock (TRUNCATE's, ALTER TABLE's) waits for it, then goes
// through, and reads after it are right.
func TestParkedTransactionLetsLocksThrough(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 0)
	ctx := context.Background()
	if got := readInt(t, ctx, c, 0, readBalance, 2); got != 100 {
		t.Fatalf("balance %d, want 100", got)
	}
	if n := testutil.ToFloat64(c.m.parked.WithLabelValues("parked")); n != 1 {
		t.Fatalf("%v transactions parked, want 1", n)
	}
	// Without the expiry the lock would wait for the client to close.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tx, err := s.conn.Begin(lctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(lctx, "LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("ACCESS EXCLUSIVE after a transaction parked: %v", err)
	}
	if _, err := tx.Exec(lctx, "UPDATE accounts SET balance = 90 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(lctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(c.m.parked.WithLabelValues("expired")); n != 1 {
		t.Fatalf("%v parked transactions expired, want 1", n)
	}
	// A read that needs the update waits for a pin after it.
	for deadline := time.Now().Add(10 * time.Second); readInt(t, ctx, c, 0, readBalance, 2) != 90; {
		if time.Now().After(deadline) {
			t.Fatal("no read saw the update in 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestParkedConnectionDied: a parked transaction whose connection
// PostgreSQL ended (an administrator, idle_in_transaction_session_timeout)
// is given up when a later transaction takes it; that one begins anew
// and reads right.
func TestParkedConnectionDied(t *testing.T) {
	s := startStack(t)
	c := s.open(t, s.url, nil, 0) // no cache-node: every read runs on PostgreSQL
	ctx := context.Background()
	failed := c.m.parked.WithLabelValues("failed")
	for try := 0; testutil.ToFloat64(failed) == 0; try++ {
		if try == 50 {
			t.Fatal("in 50 tries, no transaction took the one parked before it")
		}
		if got := readInt(t, ctx, c, 0, readBalance, 3); got != 100 {
			t.Fatalf("balance %d, want 100", got)
		}
		c.parked.mu.Lock()
		var pids []uint32
		for _, p := range c.parked.txs {
			pids = append(pids, p.conn.Conn().PgConn().PID())
		}
		c.parked.mu.Unlock()
		for _, pid := range pids {
			if _, err := s.conn.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid)); err != nil {
				t.Fatal(err)
			}
		}
		if got := readInt(t, ctx, c, 0, readBalance, 4); got != 100 {
			t.Fatalf("balance %d after the parked connection died, want 100", got)
		}
	}
}

// driverClientWithPins is the driver's client of dsn (a connection of it
// is open), once it has seen a pin.
func driverClientWithPins(t testing.TB, dsn string) *Client {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if cl := driverClient(dsn); cl != nil && len(cl.pins.candidates(time.Now().Add(-time.Minute), 0)) > 0 {
			return cl
		}
		if time.Now().After(deadline) {
			t.Fatal("the driver's client saw no pin in 30 s")
		}
	}
}

// dsnWithoutNode is the stack's larder DSN with no cache-node (and no
// L1): every read of a read-only transaction runs on PostgreSQL.
func (s *stack) dsnWithoutNode(t testing.TB, extra ...string) string {
	t.Helper()
	u, err := url.Parse(s.dsn(extra...))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("larder.nodes")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestParkedDatabaseSQLConnection: through database/sql, on one
// connection, a read-only transaction parks on it and the next one at
// the same pin begins on it; whatever else runs on the connection next
// (an autocommitted statement, a read/write transaction) runs outside it;
// and it lets an ACCESS EXCLUSIVE lock through once it expires.
func TestParkedDatabaseSQLConnection(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	dsn := s.dsnWithoutNode(t)
	db := openDB(t, DriverName, dsn)
	db.SetMaxOpenConns(1)
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	cl := driverClientWithPins(t, dsn)
	readRO := func(id int) int { return readBalanceDB(t, ctx, db, id) }
	taken := cl.m.parked.WithLabelValues("taken")
	for try := 0; testutil.ToFloat64(taken) == 0; try++ {
		if try == 50 {
			t.Fatal("in 50 tries, no read-only transaction began on the one parked before it on the connection")
		}
		if got := readRO(1 + try%accounts); got != 100 {
			t.Fatalf("balance %d, want 100", got)
		}
		if got := readRO(1 + (try+1)%accounts); got != 100 {
			t.Fatalf("balance %d, want 100", got)
		}
	}
	// An autocommitted statement after a parked transaction runs in a
	// transaction of its own (read committed, not the parked repeatable
	// read one).
	readRO(1)
	var iso string
	if err := db.QueryRowContext(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil {
		t.Fatal(err)
	}
	if iso != "read committed" {
		t.Fatalf("an autocommitted statement after a parked transaction ran at %s", iso)
	}
	// A read/write transaction after one writes.
	readRO(2)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = 95 WHERE id = 2"); err != nil {
		t.Fatalf("a write after a parked transaction: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The connection's next read-only transaction sees its write (read
	// your writes: a pin after it).
	if got := readRO(2); got != 95 {
		t.Fatalf("balance %d after the connection wrote 95", got)
	}
	// The expiry lets an ACCESS EXCLUSIVE lock through.
	expired := testutil.ToFloat64(cl.m.parked.WithLabelValues("expired"))
	parked := cl.m.parked.WithLabelValues("parked")
	for try := 0; ; try++ {
		// Right after the write, a transaction may run at a fresh
		// snapshot, which does not park.
		if try == 50 {
			t.Fatal("in 50 tries, no read-only transaction parked")
		}
		before := testutil.ToFloat64(parked)
		if got := readRO(3); got != 100 {
			t.Fatalf("balance %d, want 100", got)
		}
		if testutil.ToFloat64(parked) > before {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ltx, err := s.conn.Begin(lctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ltx.Exec(lctx, "LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("ACCESS EXCLUSIVE after a transaction parked: %v", err)
	}
	if err := ltx.Rollback(lctx); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(cl.m.parked.WithLabelValues("expired")) - expired; n != 1 {
		t.Fatalf("%v parked transactions expired, want 1", n)
	}
	if got := readRO(3); got != 100 {
		t.Fatalf("balance %d after the expiry, want 100", got)
	}
}

// TestSnapshotConsistencyThroughDatabaseSQL: the history checker of
// TestSnapshotConsistencyUnderConcurrentTransfers on the path a
// database/sql application takes: read-only transactions of the larder
// driver (sql.TxOptions{ReadOnly: true}, a cache-node and no L1) on three
// connections, under concurrent transfers, most beginning on the
// transaction parked on their connection. With a test switch that lets a
// transaction begin on one parked at another pin (broken=true), it must
// find violations.
func TestSnapshotConsistencyThroughDatabaseSQL(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			parkAnyPinForTest = broken
			defer func() { parkAnyPinForTest = false }()
			violations, reads := databaseSQLHistory(t)
			for try := 2; broken && len(violations) == 0 && try <= 5; try++ {
				t.Logf("the broken run passed %d transactions: run %d of 5", reads, try)
				violations, reads = databaseSQLHistory(t)
			}
			if broken {
				if len(violations) == 0 {
					t.Fatalf("the broken run passed %d transactions in each of 5 runs: the check cannot show the bug", reads)
				}
				t.Logf("%d violations reported in %d read-only transactions", len(violations), reads)
				return
			}
			noViolations(t, violations, reads)
			t.Logf("0 violations in %d read-only transactions", reads)
		})
	}
}

// databaseSQLHistory runs TestSnapshotConsistencyThroughDatabaseSQL's
// workload for 3 s and checks it.
func databaseSQLHistory(t *testing.T) ([]history.Violation, int64) {
	s := startStack(t)
	dsn := s.dsn()
	db := openDB(t, DriverName, dsn)
	db.SetMaxOpenConns(3)
	bg := context.Background()
	if err := db.PingContext(bg); err != nil {
		t.Fatal(err)
	}
	cl := driverClientWithPins(t, dsn)
	rec, err := history.StartRecorder(bg, s.url, "accounts")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var transfers, reads atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			transferUntil(ctx, t, s.url, seed, &transfers)
		}(int64(w))
	}
	var txMu sync.Mutex
	var txs []history.ReadTx
	for rd := 0; rd < 3; rd++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			for ctx.Err() == nil {
				// Short limits: many misses, each of which parks.
				staleness := time.Duration(50+r.Intn(500)) * time.Millisecond
				begin := time.Now()
				tx, err := db.BeginTx(WithStaleness(bg, staleness), &sql.TxOptions{ReadOnly: true})
				if err != nil {
					t.Error(err)
					return
				}
				rt := history.ReadTx{Begin: begin, Staleness: staleness, Reads: map[int]history.Row{}}
				order := r.Perm(accounts)[:1+r.Intn(accounts)]
				var rerr error
				for _, i := range order {
					var row history.Row
					if rerr = tx.QueryRowContext(bg, readBalanceVer, i+1).Scan(&row.Balance, &row.Ver); rerr != nil {
						break
					}
					rt.Reads[i+1] = row
				}
				rt.Note = fmt.Sprintf("rows %v", order)
				_ = tx.Commit()
				if errors.Is(rerr, ErrRetry) {
					continue
				}
				if rerr != nil {
					t.Error(rerr)
					return
				}
				reads.Add(1)
				txMu.Lock()
				txs = append(txs, rt)
				txMu.Unlock()
			}
		}(int64(10 + rd))
	}
	wg.Wait()
	st := cl.Stats()
	taken := testutil.ToFloat64(cl.m.parked.WithLabelValues("taken"))
	t.Logf("%d transfers, %d read-only transactions: %d node hits, %d misses, %v began on a parked transaction",
		transfers.Load(), reads.Load(), st.NodeHits.Load(), st.Misses.Load(), taken)
	if st.NodeHits.Load() == 0 || transfers.Load() == 0 || taken == 0 {
		t.Fatal("no node hit, no write or no parked transaction taken: the test proves nothing")
	}
	fctx, fcancel := context.WithTimeout(bg, 60*time.Second)
	defer fcancel()
	log, err := rec.Finish(fctx)
	if err != nil {
		t.Fatal(err)
	}
	return history.Check(log, txs, total, 50*time.Millisecond), reads.Load()
}

// TestParkRefusesOldTransactions: a PostgreSQL transaction parks only
// within ParkIdle of its BEGIN, however many transactions took it since,
// so that a chain of takers cannot hold its locks (and its now()) for
// longer.
func TestParkRefusesOldTransactions(t *testing.T) {
	m := newClientMetrics(nil).parked
	lot := newParkingLot(100*time.Millisecond, 8, m)
	if lot.park(parkedTx{born: time.Now().Add(-200 * time.Millisecond)}) {
		t.Error("the pool's lot parked a transaction begun twice ParkIdle ago")
	}
	if !lot.park(parkedTx{born: time.Now()}) {
		t.Error("the pool's lot did not park a transaction just begun")
	}
	lot.mu.Lock()
	lot.txs = nil // nothing to end: no connection
	lot.mu.Unlock()
	s := newSessionPark(nil, 100*time.Millisecond, m)
	if s.park(invalidation.Pin{SnapshotID: "x"}, nil, time.Now().Add(-200*time.Millisecond)) {
		t.Error("a database/sql connection parked a transaction begun twice ParkIdle ago")
	}
}

// TestParkedGivesWayWhenThePoolIsFull: when every connection of the pool
// is taken and one of them holds a parked transaction, a transaction that
// needs a connection ends the parked one rather than wait for its expiry.
func TestParkedGivesWayWhenThePoolIsFull(t *testing.T) {
	s := startStack(t)
	c := s.openConfig(t, PoolSized(s.url, 4), nil, 0, nil)
	ctx := context.Background()
	var open []*ROTx
	defer func() {
		for _, tx := range open {
			_ = tx.Commit(ctx)
		}
	}()
	for i := 0; i < 3; i++ { // three transactions hold three connections
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, tx)
		var bal int
		if err := tx.QueryRow(ctx, readBalance, []any{1 + i}, &bal); err != nil {
			t.Fatal(err)
		}
	}
	parked := c.m.parked.WithLabelValues("parked")
	for try := 0; testutil.ToFloat64(parked) == 0; try++ { // the fourth parks
		if try == 20 {
			t.Fatal("no transaction parked in 20 tries")
		}
		readInt(t, ctx, c, 0, readBalance, 4)
	}
	if st := c.pool.Stat(); st.IdleConns() != 0 || st.TotalConns() != 4 {
		t.Fatalf("the pool has %d connections, %d idle; want 4, none idle", st.TotalConns(), st.IdleConns())
	}
	// A transaction at a fresh snapshot (no pin is a millisecond old)
	// needs a connection of its own.
	tx, err := c.BeginRO(ctx, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(ctx)
	if n := testutil.ToFloat64(c.m.parked.WithLabelValues("evicted")); n != 1 {
		t.Fatalf("%v parked transactions gave way, want 1 (expired: %v)", n, testutil.ToFloat64(c.m.parked.WithLabelValues("expired")))
	}
}

// TestParkPreferOlderPin: a read-only transaction whose newest candidate
// pin has nothing parked on its connection, but an older candidate has,
// begins at the older one on the parked transaction (Config.ParkPrefer)
// and reads that pin's snapshot: an account's balance from before an
// update committed after it. With ParkPrefer off it begins at the newest
// and reads the update. Both through database/sql (the connection's own
// park) and through the client's pool (the parking lot).
func TestParkPreferOlderPin(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	balance := 100
	for _, tc := range []struct {
		name   string
		sql    bool
		prefer string // larder.park-prefer
	}{
		{"database-sql/prefer", true, "30s"},
		{"database-sql/off", true, "0s"},
		{"pool/prefer", false, "30s"},
		{"pool/off", false, "0s"},
		{"pool/taken-meanwhile", false, "30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefer, _ := time.ParseDuration(tc.prefer)
			var cl *Client
			var read func() int
			var parkedPin func() (invalidation.Pin, bool)
			if tc.sql {
				dsn := s.dsnWithoutNode(t, "larder.park-idle=10s", "larder.park-prefer="+tc.prefer)
				db := openDB(t, DriverName, dsn)
				db.SetMaxOpenConns(1)
				if err := db.PingContext(ctx); err != nil {
					t.Fatal(err)
				}
				cl = driverClientWithPins(t, dsn)
				read = func() int { return readBalanceDB(t, ctx, db, 4) }
				parkedPin = func() (pin invalidation.Pin, ok bool) {
					sc, err := db.Conn(ctx)
					if err != nil {
						t.Fatal(err)
					}
					defer sc.Close()
					if err := sc.Raw(func(dc any) error {
						pin, ok = dc.(*conn).park.parkedPin()
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					return pin, ok
				}
			} else {
				cl = s.openConfig(t, s.url, nil, 0, func(cfg *Config) {
					cfg.ParkIdle, cfg.ParkPrefer, cfg.Staleness = 10*time.Second, prefer, 30*time.Second
					if prefer == 0 {
						cfg.ParkPrefer = -1
					}
				})
				read = func() int { return readInt(t, ctx, cl, 30*time.Second, readBalance, 4) }
				parkedPin = func() (invalidation.Pin, bool) {
					cl.parked.mu.Lock()
					defer cl.parked.mu.Unlock()
					if len(cl.parked.txs) != 1 {
						return invalidation.Pin{}, false
					}
					return cl.parked.txs[0].pin, true
				}
			}
			// Within the staleness limit the first read may see an
			// earlier subtest's update or not: the parked pin shows old.
			old := read()
			if old < 100 || old > balance {
				t.Fatalf("balance %d, want 100 to %d", old, balance)
			}
			if _, ok := parkedPin(); !ok {
				t.Fatal("the read did not park")
			}
			balance++
			if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = 4", balance); err != nil {
				t.Fatal(err)
			}
			var after string
			if err := s.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&after); err != nil {
				t.Fatal(err)
			}
			afterLSN, err := pglogrepl.ParseLSN(after)
			if err != nil {
				t.Fatal(err)
			}
			// Wait for a pin after the update.
			for deadline := time.Now().Add(5 * time.Second); cl.pins.newest() < uint64(afterLSN); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no pin after the update in 5 s")
				}
			}
			meanwhile := strings.HasSuffix(tc.name, "taken-meanwhile")
			chosen := -1
			if meanwhile {
				// Another transaction takes the parked one after this one
				// chose its pin: it begins at its newest instead.
				pinChosenForTest = func(tx *ROTx, i int) {
					if chosen < 0 {
						chosen = len(tx.cands) - 1 - i // how many newer
						tx.c.parked.evictOldest()
					}
				}
				t.Cleanup(func() { pinChosenForTest = nil })
			}
			taken, older := cl.stats.ParkedBegins.Load(), cl.stats.OlderPinBegins.Load()
			got := read()
			taken, older = cl.stats.ParkedBegins.Load()-taken, cl.stats.OlderPinBegins.Load()-older
			if meanwhile {
				if chosen <= 0 || got != balance || taken != 0 || older != 0 {
					t.Fatalf("the parked transaction gone after the choice (%d candidates newer than the chosen pin): read %d on %d parked transactions, %d at an older pin; want %d on 0, 0",
						chosen, got, taken, older, balance)
				}
				return
			}
			if prefer > 0 {
				if got != old || taken != 1 || older != 1 {
					t.Fatalf("read %d (%d before the update, %d after) on %d parked transactions, %d at an older pin; want the parked pin's %d on 1, 1",
						got, old, balance, taken, older, old)
				}
				return
			}
			if got != balance || taken != 0 || older != 0 {
				t.Fatalf("with ParkPrefer off: read %d on %d parked transactions, %d at an older pin; want %d on 0, 0", got, taken, older, balance)
			}
		})
	}
}
