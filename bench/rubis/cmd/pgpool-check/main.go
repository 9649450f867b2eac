package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/larderdb/larder/bench/rubis/stackenv"
	larder "github.com/larderdb/larder/client-lib"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgpool-check:", err)
		os.Exit(1)
	}
}

func run() error {
	envFile := flag.String("env", ".larder-bench/stack.env", "the local stack's env file (LARDER_PG_URL, LARDER_DSN)")
	pgpoolURL := flag.String("pgpool", "postgres://postgres@127.0.0.1:25999/postgres?sslmode=disable&default_query_exec_mode=cache_describe", "the Pgpool-II in front of the stack's PostgreSQL (unnamed statements: Pgpool-II caches few results of re-executed named ones)")
	staleness := flag.Duration("staleness", 30*time.Second, "Larder's staleness limit (the same as Pgpool-II's memqcache_expire for a fair contrast)")
	duration := flag.Duration("duration", 20*time.Second, "time each mixed-read run lasts")
	readers := flag.Int("readers", 4, "concurrent reading clients in the mixed-read runs")
	writeEvery := flag.Duration("write-every", 10*time.Millisecond, "pause between the writer's transactions")
	short := flag.Duration("short-staleness", time.Second, "a second, short staleness limit Larder is also checked at (0: none)")
	flag.Parse()

	env, err := stackenv.Read(*envFile, "go run ./deploy/local up, or bash bench/rubis/pgpool.sh --check")
	if err != nil {
		return err
	}
	ctx := context.Background()
	open := func(driver, u string) (*sql.DB, error) {
		db, err := sql.Open(driver, u)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(*readers + 2)
		db.SetMaxIdleConns(*readers + 2)
		return db, nil
	}
	pg, err := open("pgx", env["LARDER_PG_URL"])
	if err != nil {
		return err
	}
	defer pg.Close()
	pool, err := open("pgx", *pgpoolURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Pgpool-II's memqcache_expire: the entries' lifetime ("30s"; "0":
	// none).
	var expire string
	if err := pool.QueryRowContext(ctx, "PGPOOL SHOW memqcache_expire", pgx.QueryExecModeSimpleProtocol).Scan(&expire); err != nil {
		return fmt.Errorf("%s is not a Pgpool-II with a query cache (PGPOOL SHOW memqcache_expire: %w)", hostOf(*pgpoolURL), err)
	}
	expiry, err := time.ParseDuration(strings.TrimSuffix(expire, "s") + "s")
	if err != nil {
		return fmt.Errorf("memqcache_expire %q: %w", expire, err)
	}
	// The systems: Pgpool-II with the writes on PostgreSQL (another
	// application, psql, a migration) and through it, and Larder at the
	// staleness limit and at a short one.
	type system struct {
		name, writeOn string
		reader        *sql.DB
		writer        *sql.DB
		larderDSN     string
	}
	systems := []system{
		{name: "Pgpool-II, expiry " + expiry.String(), writeOn: "PostgreSQL", reader: pool, writer: pg},
		{name: "Pgpool-II, expiry " + expiry.String(), writeOn: "Pgpool-II", reader: pool, writer: pool},
	}
	for _, st := range []time.Duration{*staleness, *short} {
		if st <= 0 || (st == *short && st == *staleness) {
			continue
		}
		dsn, err := withStaleness(env["LARDER_DSN"], st)
		if err != nil {
			return err
		}
		db, err := open(larder.DriverName, dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		systems = append(systems, system{name: "Larder, staleness " + st.String(), writeOn: "PostgreSQL", reader: db, writer: pg, larderDSN: dsn})
	}
	if err := setup(ctx, pg); err != nil {
		return err
	}
	defer teardown(pg)

	fmt.Printf("Pgpool-II at %s (memqcache_expire %s); Larder through its database/sql driver on %s\n\n", hostOf(*pgpoolURL), expiry, hostOf(env["LARDER_PG_URL"]))
	limit := max(*staleness, expiry) + 15*time.Second
	fmt.Println("Staleness: a cached row changed, then read every 50 ms until the new value")
	var stale []staleResult
	for _, s := range systems {
		r, err := measureStaleness(ctx, s.reader, s.writer, s.larderDSN != "", limit)
		if err != nil {
			return fmt.Errorf("%s, write on %s: %w", s.name, s.writeOn, err)
		}
		stale = append(stale, r)
		fmt.Printf("  %-26s write on %-10s: old value for %s\n", s.name, s.writeOn, r)
	}

	fmt.Printf("\nMixed reads: %d readers for %s, a writer moving 1 between two counters in one transaction every %s; transactions reading both counters whose sum is not 0\n", *readers, *duration, *writeEvery)
	var mixed []mixedResult
	for _, s := range systems {
		hits0, reads0 := cacheReads(ctx, pool, s.larderDSN)
		r, err := measureMixed(ctx, pg, s.reader, s.writer, s.larderDSN != "", *readers, *duration, *writeEvery)
		if err != nil {
			return fmt.Errorf("%s, writer on %s: %w", s.name, s.writeOn, err)
		}
		hits1, reads1 := cacheReads(ctx, pool, s.larderDSN)
		if reads1 > reads0 {
			r.hitRate = float64(hits1-hits0) / float64(reads1-reads0)
		}
		mixed = append(mixed, r)
		fmt.Printf("  %-26s writer on %-10s: %d of %d transactions mixed (%d writes; %.0f%% of reads from the cache)\n", s.name, s.writeOn, r.mixed, r.both, r.writes, 100*r.hitRate)
	}

	fmt.Printf("\n| cache | writes on | old value served for | reading both counters: mixed / transactions | reads from the cache |\n|---|---|---|---|---|\n")
	for i, s := range systems {
		fmt.Printf("| %s | %s | %s | %d / %d | %.0f%% |\n", s.name, s.writeOn, stale[i], mixed[i].mixed, mixed[i].both, 100*mixed[i].hitRate)
	}
	return nil
}

func setup(ctx context.Context, pg *sql.DB) error {
	teardown(pg)
	_, err := pg.ExecContext(ctx, `
CREATE TABLE pgpool_check_row (id int PRIMARY KEY, v bigint NOT NULL);
ALTER TABLE pgpool_check_row REPLICA IDENTITY FULL;
CREATE TABLE pgpool_check_pair (id int PRIMARY KEY, v bigint NOT NULL);
ALTER TABLE pgpool_check_pair REPLICA IDENTITY FULL;
INSERT INTO pgpool_check_row VALUES (1, 0);
INSERT INTO pgpool_check_pair VALUES (1, 0), (2, 0);`)
	if err != nil {
		return fmt.Errorf("creating the tables: %w", err)
	}
	// The invalidator learns tables as they are created: give it a moment.
	time.Sleep(2 * time.Second)
	return nil
}

func teardown(pg *sql.DB) {
	_, _ = pg.Exec("DROP TABLE IF EXISTS pgpool_check_row, pgpool_check_pair")
}

// staleResult is how long a cache served the old value after a write.
type staleResult struct {
	stale time.Duration
	fresh bool // the new value was read before the limit
	limit time.Duration
}

func (r staleResult) String() string {
	if !r.fresh {
		return fmt.Sprintf("more than %.1f s (still old when the check gave up)", r.limit.Seconds())
	}
	return fmt.Sprintf("%.2f s", r.stale.Seconds())
}

// readOnly runs f in a read-only transaction: Larder's cached kind, or a
// REPEATABLE READ one through Pgpool-II (a consistent snapshot, as far as
// PostgreSQL is concerned). Larder's ErrRetry starts it over.
func readOnly(ctx context.Context, db *sql.DB, isLarder bool, f func(*sql.Tx) error) error {
	opts := &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead}
	if isLarder {
		opts = &sql.TxOptions{ReadOnly: true}
	}
	for attempt := 0; ; attempt++ {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		err = f(tx)
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil && errors.Is(err, larder.ErrRetry) && attempt < 5 {
			continue
		}
		return err
	}
}

func readRow(ctx context.Context, db *sql.DB, isLarder bool) (int64, error) {
	var v int64
	err := readOnly(ctx, db, isLarder, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT v FROM pgpool_check_row WHERE id = 1").Scan(&v)
	})
	return v, err
}

// measureStaleness caches the row's value (read until it repeats), changes
// it through writer, and polls reader until it sees the new value.
func measureStaleness(ctx context.Context, reader, writer *sql.DB, isLarder bool, limit time.Duration) (staleResult, error) {
	r := staleResult{limit: limit}
	old, err := readRow(ctx, reader, isLarder)
	if err != nil {
		return r, err
	}
	for i := 0; i < 3; i++ { // cached now (a hit for Pgpool-II's next read)
		if _, err := readRow(ctx, reader, isLarder); err != nil {
			return r, err
		}
	}
	if _, err := writer.ExecContext(ctx, "UPDATE pgpool_check_row SET v = v + 1 WHERE id = 1"); err != nil {
		return r, err
	}
	start := time.Now()
	for time.Since(start) < limit {
		v, err := readRow(ctx, reader, isLarder)
		if err != nil {
			return r, err
		}
		if v != old {
			r.stale, r.fresh = time.Since(start), true
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r, nil
}

// mixedResult counts the transactions that read both counters and those
// that saw a sum the writer never committed.
type mixedResult struct {
	both, mixed, writes int64
	hitRate             float64 // of the reads, the share the cache served
}

// cacheReads are the reads the cache served and all reads so far: the
// counters of Larder's client for dsn, or (dsn "") Pgpool-II's SHOW
// POOL_CACHE (num_cache_hits, and those plus num_selects).
func cacheReads(ctx context.Context, pool *sql.DB, dsn string) (hits, reads int64) {
	if dsn != "" {
		st, ok := larder.DriverStats(dsn)
		if !ok {
			return 0, 0
		}
		hits = st.L1Hits.Load() + st.NodeHits.Load()
		return hits, hits + st.Misses.Load() + st.Uncacheable.Load()
	}
	var h, sel int64
	var ratio string
	var rest [6]any
	for i := range rest {
		rest[i] = new(string)
	}
	row := pool.QueryRowContext(ctx, "SHOW POOL_CACHE", pgx.QueryExecModeSimpleProtocol)
	if err := row.Scan(append([]any{&h, &sel, &ratio}, rest[:]...)...); err != nil {
		return 0, 0
	}
	return h, h + sel
}

// measureMixed runs a writer that moves 1 from counter 2 to counter 1 in
// one transaction, and readers whose transactions read counter 1, counter
// 2 or both (a third each, as pages reading overlapping data would), for d.
func measureMixed(ctx context.Context, pg, reader, writer *sql.DB, isLarder bool, readers int, d, every time.Duration) (mixedResult, error) {
	var r mixedResult
	if _, err := pg.ExecContext(ctx, "UPDATE pgpool_check_pair SET v = 0"); err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var both, mixed, writes atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, readers+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			tx, err := writer.BeginTx(ctx, nil)
			if err == nil {
				_, err = tx.ExecContext(ctx, "UPDATE pgpool_check_pair SET v = v + 1 WHERE id = 1")
				if err == nil {
					_, err = tx.ExecContext(ctx, "UPDATE pgpool_check_pair SET v = v - 1 WHERE id = 2")
				}
				if err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					errs <- fmt.Errorf("writer: %w", err)
				}
				return
			}
			writes.Add(1)
			time.Sleep(every)
		}
	}()
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, 17))
			for ctx.Err() == nil {
				kind := rnd.IntN(3)
				var a, b int64
				err := readOnly(ctx, reader, isLarder, func(tx *sql.Tx) error {
					if kind != 1 {
						if err := tx.QueryRowContext(ctx, "SELECT v FROM pgpool_check_pair WHERE id = 1").Scan(&a); err != nil {
							return err
						}
					}
					if kind != 0 {
						return tx.QueryRowContext(ctx, "SELECT v FROM pgpool_check_pair WHERE id = 2").Scan(&b)
					}
					return nil
				})
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("reader: %w", err)
					}
					return
				}
				if kind == 2 {
					both.Add(1)
					if a+b != 0 {
						mixed.Add(1)
					}
				}
			}
		}(uint64(i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return r, err
	}
	r.both, r.mixed, r.writes = both.Load(), mixed.Load(), writes.Load()
	return r, nil
}

// withStaleness sets larder.staleness in a Larder DSN.
func withStaleness(dsn string, d time.Duration) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("LARDER_DSN: %w", err)
	}
	q := u.Query()
	q.Set("larder.staleness", d.String())
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// hostOf is a PostgreSQL URL's host and port, without its credentials.
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "?"
	}
	return p.Host
}
