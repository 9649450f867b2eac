// Command rubis-bench runs RUBiS side by side in several modes against a
// running local stack, at rising client counts, and writes the report.
//
//	go run ./deploy/local up &        # the stack
//	go run ./bench/rubis/cmd/rubis-bench --env .larder-local/stack.env --out bench/rubis/results
//
// It loads the data, serves the application in this process, and runs k6
// (bench/rubis/k6/rubis.js) for each mode and client count: each mode
// gets an unmeasured warm-up, then its measured runs; the modes take turns
// (direct, larder, direct, larder, …) for --repeats rounds. It finds each
// mode's peak throughput with every interaction's p90 under the bound,
// gives the median and spread over the repeats, and writes report.json and
// report.md. With --pin-postgres, PostgreSQL (the postmaster and every
// backend) is pinned to one core so that, as in the papers, the database
// is the bottleneck. CPU is counted for the benchmark's own processes
// only: the stack's PostgreSQL (from its postmaster.pid) and NATS, the
// stack's process (--stack-pid), this process and k6.
//
// Modes php-direct, php-larder and php-larder-l1 serve RUBiS's PHP
// application (bench/rubis/php) under PHP's built-in server
// (--php-workers), on PostgreSQL and through a Larder front run in this
// process (php.go).
//
// --mode-url name=postgres://… adds a mode that runs the application
// directly, like direct, on another PostgreSQL (another version, another
// machine, a pooler); --mode-url direct=postgres://… moves the baseline.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/larderdb/larder/bench/rubis/app"
	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/bench/rubis/report"
	"github.com/larderdb/larder/bench/rubis/stackenv"
	"github.com/larderdb/larder/cache-node/store"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/bytesize"
	"github.com/larderdb/larder/internal/pprofserve"
	"github.com/larderdb/larder/internal/proccpu"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rubis-bench:", err)
		os.Exit(1)
	}
}

// larderModes are the modes through Larder.
var larderModes = []string{"larder", "larder-l1", "larder-functions", "larder-client-ryw", "larder-nocons", "local-only", "local-only-broadcast", "local-only-nocons"}

// modeURLs are the --mode-url modes: name → PostgreSQL URL.
type modeURLs map[string]string

func (m modeURLs) String() string { return "" }

func (m modeURLs) Set(v string) error {
	name, u, ok := strings.Cut(v, "=")
	if !ok || name == "" || strings.ContainsAny(name, ", ") {
		return fmt.Errorf("want name=postgres://…, got %q", v)
	}
	if slices.Contains(larderModes, name) || isPHPMode(name) {
		return fmt.Errorf("%s is a Larder or PHP mode; name the other PostgreSQL's mode otherwise", name)
	}
	if _, err := url.Parse(u); err != nil || !strings.HasPrefix(u, "postgres") {
		return fmt.Errorf("mode %s: want a postgres:// URL", name)
	}
	m[name] = u
	return nil
}

// variant is a mode at a staleness limit.
type variant struct {
	mode, label string
	staleness   time.Duration
}

// bench is what every run shares.
type bench struct {
	env      map[string]string
	urls     modeURLs
	vus      []int
	duration time.Duration
	warmup   time.Duration
	// cacheWarmup is the cached modes' extra unmeasured run before their
	// first measured one (--cache-warmup).
	cacheWarmup time.Duration
	mix         string
	think       float64
	size        datagen.Size
	meter       cpuMeter
	// templates is templates.md: each cached run's reads and misses per
	// query template.
	templates strings.Builder
	// phpReads is the running PHP mode's reads by source (php-larder's
	// front; nil otherwise).
	phpReads func() map[string]int64

	pgStatsState // --app-servers (cluster.go)
}

func run() error {
	envFile := flag.String("env", ".larder-local/stack.env", "the local stack's env file (LARDER_PG_URL, LARDER_DSN)")
	modes := flag.String("modes", "direct,larder,larder-nocons,local-only,php-direct,php-larder", "modes, comma-separated (also larder-l1: larder with an L1 (--l1) in the application; larder-client-ryw: larder without per-user sessions; larder-functions: larder with the item, user and bid history pages cached as functions; local-only-broadcast: local-only with its L1 on one broadcast subscription (larder.l1-broadcast); local-only-nocons: local-only ignoring consistency, as larder-nocons; php-direct, php-larder and php-larder-l1: the PHP application under PHP's built-in server, on PostgreSQL and through a Larder front in this process, without and with an L1)")
	urls := modeURLs{}
	flag.Var(urls, "mode-url", "name=postgres://…: a mode that runs the application directly, like direct, on another PostgreSQL (added to --modes; repeatable; direct=… moves the baseline)")
	vusList := flag.String("vus", "4,8,16,32", "client counts, comma-separated")
	duration := flag.Duration("duration", 30*time.Second, "measured time per run")
	warmup := flag.Duration("warmup", 10*time.Second, "unmeasured run before each mode's measured runs, in every repeat (0: none)")
	cacheWarmup := flag.Duration("cache-warmup", 0, "an extra unmeasured run of each cached mode before the first measured run of any mode, after which its caches approach a long-running deployment's steady state (compulsory misses mostly gone); the caches stay warm across repeats (0: none)")
	repeats := flag.Int("repeats", 1, "rounds: in each, every mode runs in turn, each round starting one mode further on (direct, larder; larder, direct; …)")
	mix := flag.String("mix", "browsing", "bidding or browsing")
	think := flag.Float64("think", 0, "think-time factor (0: peak runs)")
	preset := flag.String("preset", "txcache-memory", "data preset")
	scale := flag.Float64("scale", 0.1, "data scale")
	bound := flag.Duration("p90", time.Second, "latency bound for the peak: every interaction's p90 under it")
	stalenessList := flag.String("staleness", "30s", "staleness limits of read-only pages, comma-separated (a sweep runs each cached mode at each)")
	pin := flag.Int("pin-postgres", 0, "pin PostgreSQL to this core (-1: no pinning)")
	stackPID := flag.Int("stack-pid", 0, "the local stack's process, whose CPU (the invalidator and the cache-node) the report counts (0: the parent of the stack's PostgreSQL)")
	out := flag.String("out", "bench/rubis/results", "output folder")
	skipLoad := flag.Bool("skip-load", false, "reuse the data already loaded")
	loadOnly := flag.Bool("load-only", false, "load the data and stop")
	flag.IntVar(&phpWorkers, "php-workers", phpWorkers, "PHP_CLI_SERVER_WORKERS of the PHP modes: PHP processes serving requests, each with its own database session")
	flag.DurationVar(&nowGranularity, "now-granularity", 0, "the rounding of the application's $now in its time-dependent reads (0: a minute, RUBiS's port's default; a coarser one shows items ended up to that long ago)")
	flag.BoolVar(&sqlNow, "sql-now", false, "the application's time-dependent reads use RUBiS's original end_date >= NOW() (cached per clock bucket by Larder) instead of a $now parameter it rounds to a minute itself")
	flag.BoolVar(&splitRows, "split-rows", true, "the clients split results by rows (larder.split-rows; false: every result's tags stay whole, so any change to an item of a search page's category ends the page)")
	flag.StringVar(&freshReadWait, "fresh-read-wait", "", "how long the larder modes' reads wait for their fresh snapshot to be placed (larder.fresh-read-wait: a Go duration, 0s for no wait; empty: the client's default, 50ms)")
	flag.StringVar(&parkIdle, "park-idle", "", "how long the larder modes' read-only transactions stay open on their connections for the next one at the same pin (larder.park-idle: a Go duration, 0s for none; empty: the client's default, 200ms)")
	flag.StringVar(&parkPrefer, "park-prefer", "", "how much older than a transaction's newest candidate pin one with a transaction parked on its connection may be for it to begin there (larder.park-prefer: a Go duration, 0s for always the newest; empty: the client's default, the park idle)")
	flag.BoolVar(&registerTagSets, "register-tag-sets", true, "the clients register RUBiS's tag column sets with the invalidator (false: results reading a table the invalidator publishes only keys for use its table tag, unless another client registered the set)")
	l1 := flag.String("l1", "256MiB", "the L1 of the modes with one (larder-l1, local-only, php-larder-l1): bytes, with an optional KiB, MiB or GiB suffix")
	gogc := flag.Int("gogc", 400, "the application process's GOGC, every mode alike (its L1 is a large long-lived heap, which the collector marks again in every cycle; 0: Go's default or the GOGC variable)")
	memShare := flag.Float64("memory-share", 0.6, "the application process's soft memory limit as a share of the machine's memory (debug.SetMemoryLimit; with a high GOGC and several modes' L1s the heap would otherwise grow to several times what is live, and past the machine's memory; 0: none, or the GOMEMLIMIT variable's)")
	flag.Parse()
	if *gogc < 0 {
		return fmt.Errorf("--gogc %d: want 0 or more", *gogc)
	}
	if *memShare < 0 || *memShare > 1 {
		return fmt.Errorf("--memory-share %g: want 0 to 1", *memShare)
	}
	gcNote := "the application's GOGC: Go's default"
	if *gogc > 0 {
		debug.SetGCPercent(*gogc)
		gcNote = fmt.Sprintf("the application's GOGC: %d", *gogc)
	}
	if *memShare > 0 && os.Getenv("GOMEMLIMIT") == "" {
		total, err := machineMemory()
		if err != nil {
			return fmt.Errorf("--memory-share: %w", err)
		}
		limit := int64(float64(total) * *memShare)
		debug.SetMemoryLimit(limit)
		gcNote += fmt.Sprintf(", soft memory limit %.1f GiB", float64(limit)/(1<<30))
	}
	if n, err := bytesize.Parse(*l1); err != nil || n <= 0 {
		return fmt.Errorf("--l1 %q: want a positive size (%v)", *l1, err)
	} else {
		l1Bytes = n
	}
	pprofserve.FromEnv("LARDER_BENCH_PPROF") // the application and the Larder client under load

	env, err := stackenv.Read(*envFile, "go run ./deploy/local up")
	if err != nil {
		return err
	}
	if *repeats < 1 {
		return fmt.Errorf("--repeats: %d", *repeats)
	}
	ctx := context.Background()
	size := map[string]datagen.Size{"original": datagen.Original, "txcache-memory": datagen.TxCacheInMemory}[*preset]
	if size.Users == 0 {
		return fmt.Errorf("unknown preset %q", *preset)
	}
	size = size.Scaled(*scale)
	if !*skipLoad {
		// The stack's PostgreSQL, and the same data on every other one.
		targets := []string{env["LARDER_PG_URL"]}
		for _, u := range sortedValues(urls) {
			if u != env["LARDER_PG_URL"] && !sameServer(ctx, u, env["LARDER_PG_URL"]) {
				targets = append(targets, u)
			}
		}
		for _, target := range targets {
			conn, err := pgx.Connect(ctx, target)
			if err != nil {
				return err
			}
			_, err = datagen.Load(ctx, conn, datagen.Config{Size: size, Seed: 1, Progress: os.Stdout})
			conn.Close(ctx)
			if err != nil {
				return err
			}
		}
	}
	// The application's QUMA file: the live schema and the specification's
	// templates. The invalidator publishes its tag column sets (bench.sh
	// restarts the stack with it after the load); clients key only on the
	// sets the invalidator publishes.
	qumaFile, err := writeQUMA(ctx, env["LARDER_PG_URL"], filepath.Dir(*envFile))
	if err != nil {
		return err
	}
	if *loadOnly {
		return nil
	}
	env["LARDER_QUMA"] = qumaFile
	b := &bench{env: env, urls: urls, duration: *duration, warmup: *warmup, cacheWarmup: *cacheWarmup, mix: *mix, think: *think, size: size,
		meter: cpuMeter{procDir: "/proc", self: os.Getpid(), stack: *stackPID}}
	for _, v := range strings.Split(*vusList, ",") {
		vus, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || vus < 1 {
			return fmt.Errorf("--vus: %q", v)
		}
		b.vus = append(b.vus, vus)
	}
	postmaster, err := postmasterPID(ctx, env["LARDER_PG_URL"])
	if err != nil {
		fmt.Fprintln(os.Stderr, "rubis-bench: PostgreSQL's CPU is not counted:", err)
	} else {
		b.meter.postmaster = postmaster
		if b.meter.stack == 0 {
			b.meter.stack = proccpu.Read("/proc")[postmaster].PPID
		}
	}
	pinned := "PostgreSQL not pinned"
	if *pin >= 0 {
		if err := pinPostgres(ctx, env["LARDER_PG_URL"], postmaster, *pin); err != nil {
			return err
		}
		pinned = fmt.Sprintf("PostgreSQL pinned to core %d", *pin)
	}

	var stalenesses []time.Duration
	for _, v := range strings.Split(*stalenessList, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d <= 0 {
			return fmt.Errorf("--staleness: %q", v)
		}
		stalenesses = append(stalenesses, d)
	}
	modeList := strings.Split(*modes, ",")
	for _, name := range sortedKeys(urls) {
		if !slices.Contains(modeList, name) {
			modeList = append(modeList, name)
		}
	}
	machine := fmt.Sprintf("%d CPUs; %s; staleness %s; think factor %g; %s per run after a %s warm-up per mode; "+
		"%d repeat(s), the modes in turn, each round starting one further on; tag column sets registered by the clients: %v; NOW() in SQL: %v; L1 (modes with one): %d MiB; %s", runtime.NumCPU(), pinned, *stalenessList, *think, *duration, *warmup, *repeats, registerTagSets, sqlNow, l1Bytes>>20, gcNote)
	if *cacheWarmup > 0 {
		machine += fmt.Sprintf("; the cached modes warmed up %s more before the first measured run of any mode", *cacheWarmup)
	}
	if nowGranularity > 0 {
		machine += fmt.Sprintf("; $now rounded to %s", nowGranularity)
	}
	note, err := checkCluster(modeList)
	if err != nil {
		return err
	}
	machine += note
	var variants []variant
	for _, mode := range modeList {
		if u, ok := urls[mode]; ok {
			if sameServer(ctx, u, env["LARDER_PG_URL"]) {
				machine += fmt.Sprintf("; mode %s through %s, a pooler in front of the stack's PostgreSQL (the pooler's CPU not counted)", mode, hostOf(u))
			} else {
				machine += fmt.Sprintf("; mode %s on the PostgreSQL at %s (not pinned; its CPU not counted)", mode, hostOf(u))
			}
		}
		for _, st := range stalenesses {
			label := mode
			if len(stalenesses) > 1 && !b.direct(mode) {
				label = fmt.Sprintf("%s@%s", mode, st)
			}
			variants = append(variants, variant{mode, label, st})
			if b.direct(mode) {
				break // staleness does not apply
			}
		}
	}
	rep := &report.Report{Mix: *mix, Scale: fmt.Sprintf("%s × %g (%d users, %d active items, %d old items)", *preset, *scale, size.Users, size.ActiveItems, size.OldItems),
		Bound: *bound, Machine: machine}
	for _, st := range b.schedule(variants, *repeats) {
		if st.cacheWarmup {
			if err := b.warmCache(ctx, st.vr); err != nil {
				return err
			}
			continue
		}
		runs, err := b.measure(ctx, st.vr, st.round, *repeats)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, runs...)
	}
	rep.Peaks = report.Peaks(rep.Runs, *bound)
	rep.ConsistencyCosts = report.ConsistencyCosts(rep.Runs)
	if err := rep.Write(*out); err != nil {
		return err
	}
	if b.templates.Len() > 0 {
		head := "# Reads and misses per query template\n\n" + rep.Scale + ", " + rep.Mix + " mix. Each cached run's reads by source " +
			"(hits in an L1 or a node, misses computed on PostgreSQL, misses patched: a split result whose rows were read again by key, uncached reads) and its cache lookups that missed, by class " +
			"(larder_client_template_misses_total), the templates with most PostgreSQL reads first.\n"
		if err := os.WriteFile(filepath.Join(*out, "templates.md"), []byte(head+b.templates.String()), 0o644); err != nil {
			return err
		}
	}
	if err := rep.Plot(*out); err != nil {
		return err
	}
	fmt.Print("\n" + rep.Markdown())
	return nil
}

// direct reports whether a mode runs on PostgreSQL directly.
func (b *bench) direct(mode string) bool {
	_, other := b.urls[mode]
	return mode == "direct" || mode == "php-direct" || other
}

// step is one step of a benchmark: a variant's cache warm-up, or its
// warm-up and measured runs in a round.
type step struct {
	vr          variant
	round       int
	cacheWarmup bool
}

// schedule orders the steps. The cached variants' cache warm-ups
// (--cache-warmup) come before any measured run: their writes change the
// database every mode then runs on (the bidding mix's tables grow), and
// direct's first round must not run alone on the database as loaded.
// Then the variants take turns, round after round, so that a drift of the
// machine (another job, the data growing) falls on all of them; each
// round starts one variant further on (direct, larder, nocons; larder,
// nocons, direct; …), so that no variant always runs first or always
// follows the same one (a cached variant that runs first meets a
// cache-node only its own earlier runs warmed; one that follows another
// meets the other's writes, and may share its node).
func (b *bench) schedule(variants []variant, repeats int) []step {
	var steps []step
	if b.cacheWarmup > 0 {
		for _, vr := range variants {
			if !b.direct(vr.mode) {
				steps = append(steps, step{vr: vr, cacheWarmup: true})
			}
		}
	}
	for round := 1; round <= repeats; round++ {
		for i := range variants {
			vr := variants[(i+round-1)%len(variants)]
			steps = append(steps, step{vr: vr, round: round})
		}
	}
	return steps
}

// warmCache gives a cached variant's caches the extra unmeasured run of
// --cache-warmup: a cache that has run for a while, whose first reads of
// most keys (compulsory misses) are behind it, as in a deployment that
// has served for longer than a benchmark run. The caches stay warm
// across the variant's later runs.
func (b *bench) warmCache(ctx context.Context, vr variant) error {
	base, stop, err := b.serveMode(ctx, vr)
	if err != nil {
		return err
	}
	defer stop()
	if _, _, err := k6(ctx, base, vr.label, b.vus[0], b.cacheWarmup, b.mix, b.think, b.size); err != nil {
		return fmt.Errorf("cache warm-up of %s: %w", vr.label, err)
	}
	return nil
}

// measure serves the application in one variant, warms it up and runs it
// at every client count.
func (b *bench) measure(ctx context.Context, vr variant, round, repeats int) ([]report.Run, error) {
	base, stop, err := b.serveMode(ctx, vr)
	if err != nil {
		return nil, err
	}
	defer stop()
	if b.warmup > 0 {
		// Unmeasured: every mode starts its measured runs warm (the node
		// and L1s for the cached ones, PostgreSQL's buffers for all), not
		// only the modes that happen to run later.
		if _, _, err := k6(ctx, base, vr.label, b.vus[0], b.warmup, b.mix, b.think, b.size); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	var runs []report.Run
	for _, vus := range b.vus {
		cpu0 := b.meter.sample()
		reads0 := b.reads(vr)
		tpl0 := b.templateFigures(vr)
		start := time.Now()
		r, k6CPU, err := k6(ctx, base, vr.label, vus, b.duration, b.mix, b.think, b.size)
		if err != nil {
			return nil, err
		}
		wall := time.Since(start).Seconds()
		cpu1 := b.meter.sample()
		r.Repeat = round
		r.CPU = map[string]float64{"k6": k6CPU.Seconds() / wall}
		for g, v := range cpu1 {
			r.CPU[g] = (v - cpu0[g]) / wall
		}
		if reads1 := b.reads(vr); reads1 != nil {
			r.Reads = map[string]int64{}
			for k, v := range reads1 {
				r.Reads[k] = v - reads0[k]
			}
		}
		if tpl0 != nil {
			writeTemplates(&b.templates, fmt.Sprintf("repeat %d, %s, %d VUs", round, vr.label, vus), tpl0, b.templateFigures(vr))
		}
		// The window in seconds since the process started, the clock of
		// GODEBUG=gctrace=1's "gc N @Ts" lines: a collection of the
		// application's heap inside a window shows there.
		fmt.Printf("repeat %d/%d  %-20s %3d VUs: %7.0f requests/s, worst p90 %7.1f ms (%s); window %.0f-%.0f s since start\n", round, repeats, vr.label, vus, r.Rate, r.WorstP90, r.Worst,
			start.Sub(processStart).Seconds(), time.Since(processStart).Seconds())
		runs = append(runs, r)
	}
	return runs, nil
}

// serveMode serves the application of a variant: the Go application in
// this process, or the PHP one (php.go).
func (b *bench) serveMode(ctx context.Context, vr variant) (string, func(), error) {
	if appServers > 1 {
		return b.serveCluster(ctx, vr)
	}
	if isPHPMode(vr.mode) {
		base, stop, reads, err := b.servePHP(ctx, vr)
		if err != nil {
			return "", nil, err
		}
		b.phpReads = reads
		return base, func() { stop(); b.phpReads = nil }, nil
	}
	db, err := b.open(vr.mode, vr.label)
	if err != nil {
		return "", nil, err
	}
	// Keep connections open in every mode: database/sql keeps only two
	// idle ones by default, and reconnecting on every request would
	// measure PostgreSQL's fork, not the modes.
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	// Users carry their read-your-writes session in a cookie, except in
	// larder-client-ryw, where every write holds back every user's reads
	// (the client's own session).
	base, stop, err := serve(db, vr.staleness, vr.mode != "larder-client-ryw", vr.mode == "larder-functions")
	if err != nil {
		db.Close()
		return "", nil, err
	}
	return base, func() { stop(); db.Close() }, nil
}

// open opens a mode's database handle.
func (b *bench) open(mode, label string) (*sql.DB, error) {
	if u, ok := b.urls[mode]; ok {
		return sql.Open("pgx", u)
	}
	return openMode(mode, label, b.env)
}

// reads returns the larder client's reads by source (nil in the direct
// modes).
func (b *bench) reads(vr variant) map[string]int64 {
	if appServers > 1 {
		return b.clusterReads(vr)
	}
	if isPHPMode(vr.mode) && b.phpReads != nil {
		return b.phpReads()
	}
	if u, ok := b.urls[vr.mode]; ok {
		return queryCacheReads(u)
	}
	if b.direct(vr.mode) || isPHPMode(vr.mode) {
		return nil
	}
	return readsOf(vr.mode, vr.label, b.env)
}

// queryCacheReads are the query-cache counters of a pooler that has one
// (Pgpool-II's SHOW POOL_CACHE: num_cache_hits, num_selects), nil for
// PostgreSQL itself.
func queryCacheReads(u string) map[string]int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW POOL_CACHE", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil
	}
	defer rows.Close()
	if !rows.Next() {
		return nil
	}
	vals, err := rows.Values()
	if err != nil {
		return nil
	}
	cols := rows.FieldDescriptions()
	m := map[string]int64{}
	for i, c := range cols {
		key := map[string]string{"num_cache_hits": "query-cache-hits", "num_selects": "query-cache-selects"}[c.Name]
		if key == "" || i >= len(vals) {
			continue
		}
		n, err := strconv.ParseInt(fmt.Sprint(vals[i]), 10, 64)
		if err != nil {
			return nil
		}
		m[key] = n
	}
	if len(m) != 2 {
		return nil
	}
	return m
}

// hostOf is a PostgreSQL URL's host, port and database, without its
// credentials.
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "?"
	}
	return p.Host + p.Path
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedValues(m map[string]string) []string {
	var vs []string
	for _, k := range sortedKeys(m) {
		if !slices.Contains(vs, m[k]) {
			vs = append(vs, m[k])
		}
	}
	return vs
}

func openMode(mode, label string, env map[string]string) (*sql.DB, error) {
	if mode == "direct" {
		return sql.Open("pgx", env["LARDER_PG_URL"])
	}
	dsn := modeDSN(mode, label, env)
	if dsn == "" {
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	return sql.Open(larder.DriverName, dsn)
}

// registerTagSets: the larder modes' clients register the QUMA file's tag
// column sets with the invalidator (--register-tag-sets).
// processStart is when the process started (near enough: its package
// variables are set before main runs).
var processStart = time.Now()

var registerTagSets = true

// splitRows: the larder modes' clients split results by rows (--split-rows).
var splitRows = true

// freshReadWait: how long the larder modes' reads wait for a fresh
// snapshot's placement (--fresh-read-wait, larder.fresh-read-wait; "":
// the client's default).
var freshReadWait string

// parkIdle: how long the larder modes' read-only transactions stay parked
// (--park-idle, larder.park-idle; "": the client's default).
var parkIdle string

// parkPrefer: how much older a pin with a transaction parked on the
// connection may be for the larder modes' transactions to begin at it
// (--park-prefer, larder.park-prefer; "": the client's default).
var parkPrefer string

// sqlNow: the application runs RUBiS's original NOW() SQL (--sql-now).
var sqlNow bool

// nowGranularity is the rounding of the application's $now
// (--now-granularity; 0: the application's default, a minute).
var nowGranularity time.Duration

// l1Bytes is the L1 of the modes with one (--l1).
var l1Bytes int64 = 256 << 20

// modeDSN is the larder DSN of a mode.
func modeDSN(mode, label string, env map[string]string) string {
	u, err := url.Parse(env["LARDER_DSN"])
	if err != nil {
		return ""
	}
	q := u.Query()
	if f := env["LARDER_QUMA"]; f != "" {
		q.Set("larder.quma", f)
	}
	if !registerTagSets {
		q.Set("larder.register-tag-sets", "false")
	}
	if !splitRows {
		q.Set("larder.split-rows", "false")
	}
	if freshReadWait != "" {
		q.Set("larder.fresh-read-wait", freshReadWait)
	}
	if parkIdle != "" {
		q.Set("larder.park-idle", parkIdle)
	}
	if parkPrefer != "" {
		q.Set("larder.park-prefer", parkPrefer)
	}
	switch mode {
	case "larder", "larder-client-ryw", "larder-functions":
	case "larder-nocons":
		// The ablation that measures what consistency costs.
		larder.EnableUnsafeBenchmarkAblation()
		q.Set(larder.UnsafeAblationParam, "true")
	case "larder-l1":
		// The node and each application instance's L1 in front of it.
		q.Set("larder.l1", strconv.FormatInt(l1Bytes, 10))
	case "local-only", "local-only-broadcast", "local-only-nocons":
		q.Del("larder.nodes")
		q.Set("larder.l1", strconv.FormatInt(l1Bytes, 10))
		switch mode {
		case "local-only-broadcast":
			q.Set("larder.l1-broadcast", "true")
		case "local-only-nocons":
			// The same ablation for the L1 alone.
			larder.EnableUnsafeBenchmarkAblation()
			q.Set(larder.UnsafeAblationParam, "true")
		}
	default:
		return ""
	}
	// Each variant its own client (and L1): the driver shares one per DSN.
	q.Set("application_name", "rubis-"+label)
	u.RawQuery = q.Encode()
	return u.String()
}

// writeQUMA analyzes the database's schema with RUBiS's templates into
// dir/quma.json.
func writeQUMA(ctx context.Context, pgURL, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path, err := filepath.Abs(filepath.Join(dir, "quma.json"))
	if err != nil {
		return "", err
	}
	return datagen.WriteQUMA(ctx, pgURL, path)
}

// serve runs the application on a free port.
func serve(db *sql.DB, staleness time.Duration, sessions, functions bool) (string, func(), error) {
	a, err := app.New(app.Config{DB: db, NowGranularity: nowGranularity, UseSQLNow: sqlNow, Functions: functions, ReadContext: func(ctx context.Context) context.Context { return larder.WithStaleness(ctx, staleness) }})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	h := a.Handler()
	if sessions {
		// Each emulated user carries its read-your-writes session in a
		// cookie, as a web application would.
		h = larder.HTTPSessions(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// k6 runs the script once and reads its summary; it also returns the CPU
// time k6 used.
func k6(ctx context.Context, base, mode string, vus int, d time.Duration, mix string, think float64, size datagen.Size) (report.Run, time.Duration, error) {
	bin, err := exec.LookPath("k6")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "k6")
		if _, err := os.Stat(bin); err != nil {
			return report.Run{}, 0, errors.New("k6 is not installed: bash deploy/install-deps.sh")
		}
	}
	tmp, err := os.CreateTemp("", "rubis-k6-*.json")
	if err != nil {
		return report.Run{}, 0, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.CommandContext(ctx, bin, "run", "--quiet", "--no-usage-report", "--summary-export", tmp.Name(),
		"-e", "BASE_URL="+base, "-e", "MIX="+mix, "-e", fmt.Sprintf("THINK=%g", think), "-e", fmt.Sprintf("VUS=%d", vus),
		"-e", "DURATION="+d.String(), "-e", fmt.Sprintf("USERS=%d", size.Users), "-e", fmt.Sprintf("ITEMS=%d", size.ActiveItems),
		"-e", fmt.Sprintf("CATEGORIES=%d", size.Categories), "-e", fmt.Sprintf("REGIONS=%d", size.Regions), "bench/rubis/k6/rubis.js")
	if out, err := cmd.CombinedOutput(); err != nil {
		return report.Run{}, 0, fmt.Errorf("k6 (%s, %d VUs): %v\n%s", mode, vus, err, out)
	}
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	f, err := os.Open(tmp.Name())
	if err != nil {
		return report.Run{}, 0, err
	}
	defer f.Close()
	r, err := report.ParseSummary(f, mode, vus)
	return r, cpu, err
}

// readsOf returns the larder client's reads by source for a mode's DSN.
func readsOf(mode, label string, env map[string]string) map[string]int64 {
	if mode == "direct" {
		return nil
	}
	st, ok := larder.DriverStats(modeDSN(mode, label, env))
	if !ok {
		return nil
	}
	return statsOf(st)
}

// statsOf is a client's reads by source, its node's and L1's misses by
// class, its fresh snapshots and its function calls.
func statsOf(st *larder.Stats) map[string]int64 {
	return map[string]int64{"l1": st.L1Hits.Load(), "node": st.NodeHits.Load(), "database": st.Misses.Load(), "patched": st.Patches.Load(),
		"uncacheable":     st.Uncacheable.Load(),
		"miss-compulsory": st.NodeMisses[store.MissCompulsory].Load(), "miss-staleness": st.NodeMisses[store.MissStaleness].Load(),
		"miss-capacity": st.NodeMisses[store.MissCapacity].Load(), "miss-consistency": st.NodeMisses[store.MissConsistency].Load(),
		"l1-miss-compulsory": st.L1Misses[store.MissCompulsory].Load(), "l1-miss-staleness": st.L1Misses[store.MissStaleness].Load(),
		"l1-miss-capacity": st.L1Misses[store.MissCapacity].Load(), "l1-miss-consistency": st.L1Misses[store.MissConsistency].Load(),
		"tx-fresh-snapshot": st.NowSnapshots.Load(), "tx-fallback": st.Fallbacks.Load(), "tx-fresh-wait-us": st.FreshWaitNanos.Load() / 1000,
		"unplaced-reads": st.UnplacedReads.Load(), "tx-pin-begins": st.PinBegins.Load(), "tx-parked-begins": st.ParkedBegins.Load(),
		"tx-older-pin-begins": st.OlderPinBegins.Load(),
		"node-lookups":        st.NodeLookups.Load(), "node-errors": st.NodeErrors.Load(), "function-hits": st.FunctionHits.Load(), "function-runs": st.FunctionRuns.Load()}
}

// machineMemory is the machine's memory in bytes (MemTotal in
// /proc/meminfo).
func machineMemory() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMemTotal(string(b))
}

// parseMemTotal reads MemTotal from /proc/meminfo's text.
func parseMemTotal(meminfo string) (int64, error) {
	for _, line := range strings.Split(meminfo, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal %q", f[1])
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo: no MemTotal in kB")
}

// postmasterPID reads the PID of PostgreSQL's postmaster from its data
// folder's postmaster.pid.
// sameServer reports whether two URLs reach the same PostgreSQL server
// (one through a pooler, say): the same data folder and start time.
func sameServer(ctx context.Context, a, b string) bool {
	var ids [2]string
	for i, u := range []string{a, b} {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return false
		}
		err = conn.QueryRow(ctx, "SELECT current_setting('data_directory') || ' ' || pg_postmaster_start_time()::text", pgx.QueryExecModeSimpleProtocol).Scan(&ids[i])
		conn.Close(ctx)
		if err != nil {
			return false
		}
	}
	return ids[0] == ids[1]
}

func postmasterPID(ctx context.Context, pgURL string) (int, error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return 0, err
	}
	return proccpu.PostmasterPID(dataDir)
}

// pinPostgres pins the postmaster and every backend to one core; backends
// started later inherit it.
func pinPostgres(ctx context.Context, pgURL string, postmaster, core int) error {
	if postmaster < 1 {
		return errors.New("pin PostgreSQL: its postmaster's PID is unknown (--pin-postgres -1 runs unpinned)")
	}
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	pids := []string{strconv.Itoa(postmaster)}
	rows, err := conn.Query(ctx, "SELECT pid::text FROM pg_stat_activity")
	if err != nil {
		return err
	}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err == nil {
			pids = append(pids, p)
		}
	}
	rows.Close()
	for _, p := range pids {
		if out, err := exec.CommandContext(ctx, "taskset", "-a", "-p", "-c", strconv.Itoa(core), p).CombinedOutput(); err != nil {
			return fmt.Errorf("taskset %s: %v: %s", p, err, out)
		}
	}
	return nil
}

// templateFigures are the Go application's Larder reads per template in
// a cached mode (nil in the others).
func (b *bench) templateFigures(vr variant) []larder.TemplateFigures {
	if appServers > 1 || isPHPMode(vr.mode) || b.direct(vr.mode) {
		return nil
	}
	fs, _ := larder.DriverTemplates(modeDSN(vr.mode, vr.label, b.env))
	return fs
}

// writeTemplates appends to w the table of a run: each template's reads
// and misses between before and after, the most PostgreSQL reads first.
func writeTemplates(w *strings.Builder, title string, before, after []larder.TemplateFigures) {
	prev := map[string]larder.TemplateFigures{}
	for _, f := range before {
		prev[f.Template] = f
	}
	type row struct {
		sql         string
		reads, miss map[string]int64
		database, n int64
	}
	var rows []row
	for _, f := range after {
		p := prev[f.Template]
		r := row{sql: f.SQL, reads: map[string]int64{}, miss: map[string]int64{}}
		for k, v := range f.Reads {
			r.reads[k] = v - p.Reads[k]
			r.n += r.reads[k]
		}
		for k, v := range f.Misses {
			r.miss[k] = v - p.Misses[k]
		}
		r.database = r.reads["database"] + r.reads["uncached"]
		if r.n > 0 {
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].database != rows[j].database {
			return rows[i].database > rows[j].database
		}
		return rows[i].sql < rows[j].sql
	})
	fmt.Fprintf(w, "\n## %s\n\n", title)
	w.WriteString("| template | reads | hits: L1 / node | PostgreSQL: cached / patched / uncached | L1 misses: compulsory / staleness / capacity / consistency | node misses: compulsory / staleness / capacity / consistency |\n|---|---|---|---|---|---|\n")
	classes := func(m map[string]int64, cache string) string {
		return fmt.Sprintf("%d / %d / %d / %d", m[cache+" compulsory"], m[cache+" staleness"], m[cache+" capacity"], m[cache+" consistency"])
	}
	for _, r := range rows {
		sql := strings.Join(strings.Fields(r.sql), " ")
		if len(sql) > 100 {
			sql = sql[:100] + "…"
		}
		fmt.Fprintf(w, "| `%s` | %d | %d / %d | %d / %d / %d | %s | %s |\n", strings.ReplaceAll(sql, "|", "\\|"), r.n, r.reads["l1"], r.reads["node"],
			r.reads["database"], r.reads["patched"], r.reads["uncached"], classes(r.miss, "l1"), classes(r.miss, "node"))
	}
}
