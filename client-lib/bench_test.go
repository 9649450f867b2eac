package larder

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// BenchmarkReadOnlyTransaction: one read-only transaction reading one
// row, on plain pgx and through Larder (miss path with no cache at all,
// L1 hit, node hit), in the same run.
func BenchmarkReadOnlyTransaction(b *testing.B) {
	s := startStackB(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.Run("pgx", func(b *testing.B) {
		cpu := pgCPU(b)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			pgxReadBalance(ctx, b, pool, 1+i%accounts)
		}
		b.StopTimer()
		reportPGCPU(b, cpu)
	})
	run := func(name string, c *Client) {
		b.Run(name, func(b *testing.B) {
			cpu := pgCPU(b)
			taken := testutil.ToFloat64(c.m.parked.WithLabelValues("taken"))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tx, err := c.BeginRO(ctx, 0)
				if err != nil {
					b.Fatal(err)
				}
				var bal int
				if err := tx.QueryRow(ctx, readBalance, []any{1 + i%accounts}, &bal); err != nil {
					b.Fatal(err)
				}
				_ = tx.Commit(ctx)
			}
			b.StopTimer()
			reportPGCPU(b, cpu)
			b.ReportMetric((testutil.ToFloat64(c.m.parked.WithLabelValues("taken"))-taken)/float64(b.N), "parked-taken/op")
		})
	}
	// A miss begins on the transaction the one before it parked at the
	// same pin (parked.go) when one is parked there; unparked, every miss
	// imports the pin's snapshot.
	run("larder-miss-no-cache", s.clientB(b, nil, 0))
	run("larder-miss-unparked", s.openConfig(b, s.url, nil, 0, func(cfg *Config) { cfg.ParkIdle = -1 }))
	run("larder-L1-hit", s.clientB(b, []string{s.node}, 8<<20))
	run("larder-node-hit", s.clientB(b, []string{s.node}, 0))
}

// BenchmarkDatabaseSQLReadOnly: the miss path through database/sql, as an
// application writes it: one read-only transaction (sql.TxOptions{ReadOnly:
// true}) reading one row, on pgx's database/sql driver and on Larder's
// with no cache at all (every read a miss), its transactions parked
// (parked.go) and not, in the same run.
func BenchmarkDatabaseSQLReadOnly(b *testing.B) {
	s := startStackB(b)
	ctx := context.Background()
	run := func(name, driverName, dsn string) {
		db, err := sql.Open(driverName, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		if err := db.PingContext(ctx); err != nil {
			b.Fatal(err)
		}
		if driverName == DriverName {
			driverClientWithPins(b, dsn)
		}
		b.Run(name, func(b *testing.B) {
			cpu := pgCPU(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
				if err != nil {
					b.Fatal(err)
				}
				var bal int
				if err := tx.QueryRowContext(ctx, readBalance, 1+i%accounts).Scan(&bal); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportPGCPU(b, cpu)
		})
	}
	run("pgx", "pgx", s.url)
	run("larder-miss", DriverName, s.dsnWithoutNode(b))
	run("larder-miss-unparked", DriverName, s.dsnWithoutNode(b, "larder.park-idle=0s"))
}

// BenchmarkL1Hit: one query answered from the L1 inside an open
// read-only transaction.
func BenchmarkL1Hit(b *testing.B) {
	s := startStackB(b)
	c := s.clientB(b, []string{s.node}, 8<<20)
	ctx := context.Background()
	tx, err := c.BeginRO(ctx, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Commit(ctx)
	var bal int
	if err := tx.QueryRow(ctx, readBalance, []any{1}, &bal); err != nil { // the miss that fills the L1
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := tx.QueryRow(ctx, readBalance, []any{1}, &bal); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if c.Stats().L1Hits.Load() < int64(b.N) {
		b.Fatalf("%d L1 hits for %d queries", c.Stats().L1Hits.Load(), b.N)
	}
}

// BenchmarkL1HitTransaction: a read-only transaction of eight reads, all
// answered from the L1, with consistency and with the ablation that
// ignores it (UnsafeIgnoreConsistency), in the same run: what keeping to
// one snapshot costs a transaction that only hits (its begin takes the
// candidate pins, each hit narrows them). The test stack's pincushion
// holds about thirty pins within the transactions' staleness, as a
// loaded one does (its budget is 32).
func BenchmarkL1HitTransaction(b *testing.B) {
	s := startStackB(b)
	ctx := context.Background()
	// Let the pincushion place its pins first: both variants then see as
	// many.
	probe := s.openConfig(b, s.url, nil, 0, nil)
	for deadline := time.Now().Add(10 * time.Second); len(probe.pins.candidates(time.Now().Add(-probe.cfg.Staleness), 0)) < 25 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	for _, v := range []struct {
		name   string
		nocons bool
	}{{"consistent", false}, {"nocons", true}} {
		c := s.openConfig(b, s.url, nil, 8<<20, func(cfg *Config) { cfg.UnsafeIgnoreConsistency = v.nocons })
		read := func() error {
			tx, err := c.BeginRO(ctx, 0)
			if err != nil {
				return err
			}
			defer tx.Commit(ctx)
			for id := 1; id <= accounts; id++ { // eight keys: two reads of each account
				var bal, ver int
				if err := tx.QueryRow(ctx, readBalance, []any{id}, &bal); err != nil {
					return err
				}
				if err := tx.QueryRow(ctx, readBalanceVer, []any{id}, &bal, &ver); err != nil {
					return err
				}
			}
			return tx.Commit(ctx)
		}
		// The misses that fill the L1, until a transaction hits all
		// eight (the L1 keeps a result once the invalidation stream
		// covers it).
		for try := 0; ; try++ {
			hits := c.Stats().L1Hits.Load()
			if err := read(); err != nil {
				b.Fatal(err)
			}
			if c.Stats().L1Hits.Load()-hits == 8 {
				break
			}
			if try == 100 {
				b.Fatal("in 100 tries, no transaction hit all eight reads in the L1")
			}
			time.Sleep(50 * time.Millisecond)
		}
		b.Run(v.name, func(b *testing.B) {
			hits := c.Stats().L1Hits.Load()
			var cands int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := read(); err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					cands = len(c.pins.candidates(time.Now().Add(-c.cfg.Staleness), 0))
				}
			}
			b.StopTimer()
			if n := c.Stats().L1Hits.Load() - hits; n < 8*int64(b.N) {
				b.Fatalf("%d L1 hits for %d transactions of 8 reads", n, b.N)
			}
			b.ReportMetric(float64(cands), "pins")
		})
	}
}

// BenchmarkMixedReadOnly: 8 clients run read-only transactions of four
// reads each over 1 000 rows while a writer updates random rows; plain
// pgx against Larder (L1 and node), in the same run. Reported as
// transactions per second.
func BenchmarkMixedReadOnly(b *testing.B) {
	const rows = 1000
	values := make([]string, rows)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, 100)", i+1)
	}
	s := startStackWith(b, schemaSQL, "INSERT INTO accounts (id, balance) VALUES "+strings.Join(values, ","),
		readBalance, "UPDATE accounts SET balance = balance - $1, ver = ver + 1 WHERE id = $2")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	c := s.clientB(b, []string{s.node}, 32<<20)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writer: ~200 updates/s
		defer wg.Done()
		r := rand.New(rand.NewSource(1))
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = pool.Exec(ctx, "UPDATE accounts SET balance = balance + 1, ver = ver + 1 WHERE id = $1", 1+r.Intn(rows))
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	readTx := map[string]func(r *rand.Rand) error{
		"pgx": func(r *rand.Rand) error {
			return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				for k := 0; k < 4; k++ {
					var bal int
					if err := tx.QueryRow(ctx, readBalance, 1+r.Intn(rows)).Scan(&bal); err != nil {
						return err
					}
				}
				return nil
			})
		},
		"larder": func(r *rand.Rand) error {
			tx, err := c.BeginRO(ctx, 0)
			if err != nil {
				return err
			}
			defer tx.Commit(ctx)
			for k := 0; k < 4; k++ {
				var bal int
				if err := tx.QueryRow(ctx, readBalance, []any{1 + r.Intn(rows)}, &bal); err != nil && err != ErrRetry {
					return err
				}
			}
			return nil
		},
	}
	for _, name := range []string{"pgx", "larder"} {
		f := readTx[name]
		b.Run(name, func(b *testing.B) {
			var seed atomic.Int64
			start := time.Now()
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewSource(seed.Add(1)))
				for pb.Next() {
					if err := f(r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
		})
	}
}

// BenchmarkReadAfterWrite: a session writes a row, then reads another in
// a read-only transaction, as a web user does after a bid; plain pgx
// against Larder (L1 and node), in the same run. Larder's read needs a
// snapshot at or after the write (read your writes): with no pin that
// recent, the pincushion places one of the transaction's own, whose wait
// is reported as fresh-wait-us.
func BenchmarkReadAfterWrite(b *testing.B) {
	s := startStackB(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	const write = "UPDATE accounts SET balance = balance - $1, ver = ver + 1 WHERE id = $2"
	b.Run("pgx", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := pool.Exec(ctx, write, 0, 2); err != nil {
				b.Fatal(err)
			}
			pgxReadBalance(ctx, b, pool, 1)
		}
	})
	// larder waits for its fresh snapshot's placement (at most the
	// default wait), then reads through the caches; larder-no-wait reads
	// at once on PostgreSQL while the snapshot is placed.
	for _, v := range []struct {
		name string
		wait time.Duration
	}{{"larder", DefaultFreshReadWait}, {"larder-no-wait", -1}} {
		b.Run(v.name, func(b *testing.B) {
			c := s.clientB(b, []string{s.node}, 8<<20)
			c.cfg.FreshReadWait = v.wait
			st := c.Stats()
			fresh, wait, unplaced := st.NowSnapshots.Load(), st.FreshWaitNanos.Load(), st.UnplacedReads.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w, err := c.BeginRW(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.Exec(ctx, write, 0, 2); err != nil {
					b.Fatal(err)
				}
				if err := w.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				tx, err := c.BeginRO(ctx, 0)
				if err != nil {
					b.Fatal(err)
				}
				var bal int
				if err := tx.QueryRow(ctx, readBalance, []any{1}, &bal); err != nil {
					b.Fatal(err)
				}
				_ = tx.Commit(ctx)
			}
			b.StopTimer()
			c.placements.Wait()
			if n := st.NowSnapshots.Load() - fresh; n > 0 {
				b.ReportMetric(float64(st.FreshWaitNanos.Load()-wait)/float64(n)/1e3, "place-us")
				b.ReportMetric(float64(n)/float64(b.N), "fresh/op")
			}
			b.ReportMetric(float64(st.UnplacedReads.Load()-unplaced)/float64(b.N), "unplaced/op")
		})
	}
}

// pgxReadBalance reads an account's balance in a plain pgx read-only
// transaction: the baseline of the benchmarks.
func pgxReadBalance(ctx context.Context, b *testing.B, pool *pgxpool.Pool, id int) {
	var bal int
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, readBalance, id).Scan(&bal)
	})
	if err != nil {
		b.Fatal(err)
	}
}
