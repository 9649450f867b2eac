package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/larderdb/larder/internal/bytesize"
	"github.com/larderdb/larder/internal/pprofserve"
	"github.com/larderdb/larder/internal/secret"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "demo") {
		fmt.Fprintln(os.Stderr, "usage: local up|demo [-dir DIR] [-pg-port N] [-nats-port N] [-redis-port N] [-nats-bin PATH|embedded] [-cache-node-port N] [-cache-nodes N] [-standalone-cache-nodes N] [-overlay-latency D] [-broadcast-invalidation] [-invalidator-metrics ADDR] [-cache-node-metrics ADDR] [-quma FILE] [-fix-replica-identity]")
		os.Exit(2)
	}
	verb := os.Args[1]
	cfg := DefaultConfig()
	fs := flag.NewFlagSet(verb, flag.ExitOnError)
	fs.StringVar(&cfg.Dir, "dir", cfg.Dir, "folder that keeps the servers' data across restarts")
	fs.IntVar(&cfg.PostgresPort, "pg-port", cfg.PostgresPort, "PostgreSQL port on 127.0.0.1 (0: any free port)")
	fs.IntVar(&cfg.NATSPort, "nats-port", cfg.NATSPort, "NATS port on 127.0.0.1 (0: any free port)")
	fs.IntVar(&cfg.RedisPort, "redis-port", cfg.RedisPort, "Redis port on 127.0.0.1 (0: any free port)")
	fs.StringVar(&cfg.NATSBin, "nats-bin", cfg.NATSBin, `nats-server binary to run, or "embedded" to run NATS in this process`)
	fs.IntVar(&cfg.CacheNodePort, "cache-node-port", cfg.CacheNodePort, "cache-node port on 127.0.0.1 (0: any free port)")
	fs.StringVar(&cfg.InvalidatorMetrics, "invalidator-metrics", cfg.InvalidatorMetrics, `address of the invalidator's /metrics ("" for none)`)
	fs.StringVar(&cfg.CacheNodeMetrics, "cache-node-metrics", cfg.CacheNodeMetrics, `address of the cache-node's /metrics ("" for none; with -cache-nodes N, the next nodes take the next ports)`)
	fs.IntVar(&cfg.CacheNodes, "cache-nodes", 1, "cache-nodes to run; more than one join a libp2p overlay (credentials in the secrets folder), on consecutive ports from -cache-node-port, and LARDER_DSN lists them with larder.node-placement=home (the first is the home node)")
	fs.IntVar(&cfg.StandaloneCacheNodes, "standalone-cache-nodes", 0, "more cache-nodes outside the overlay, on the ports after its nodes, each caching alone (LARDER_STANDALONE_NODES; the benchmarks' local-only caching)")
	fs.DurationVar(&cfg.OverlayLatency, "overlay-latency", 0, "added to every request a cache-node forwards to another: an emulation of slower links between nodes, for benchmarks")
	fs.BoolVar(&cfg.BroadcastInvalidation, "broadcast-invalidation", false, "run the cache-nodes in the broadcast ablation: each receives every invalidation (cache-node --broadcast-invalidation)")
	fs.StringVar(&cfg.InvalidatorQUMA, "quma", cfg.InvalidatorQUMA, "the application's QUMA file (qumaana analyze): the invalidator starts with its tag column sets and LARDER_DSN names it (default: one the stack writes, keyed on each table's keys; clients register any other set they key on at run time)")
	fs.IntVar(&cfg.FrontPort, "front-port", cfg.FrontPort, "port of the PostgreSQL wire front on 127.0.0.1 (LARDER_PROXY_URL: psql and any driver read through Larder inside BEGIN READ ONLY; 0: any free port; -1: no front)")
	fs.StringVar(&cfg.FrontMetrics, "front-metrics", cfg.FrontMetrics, `address of the front's /metrics ("" for none)`)
	fs.BoolVar(&cfg.FixReplicaIdentity, "fix-replica-identity", cfg.FixReplicaIdentity, "let the invalidator run the ALTER TABLE … REPLICA IDENTITY FULL statements its checks ask for (default: it waits for them, PostgreSQL staying up)")
	fs.DurationVar(&cfg.PinMaxAge, "max-staleness", 0, "how long the invalidator's pincushion keeps a pin (its --max-staleness; 0: its default, 60s)")
	nodeMemory := fs.String("cache-node-memory", "256MiB", "each cache-node's byte budget (e.g. 16MiB: the cache-size sweep of bench/rubis)")
	pgSettings := fs.String("pg-settings", "", "extra PostgreSQL settings, name=value,… (e.g. shared_preload_libraries=pg_stat_statements)")
	_ = fs.Parse(os.Args[2:])
	pprofserve.FromEnv("LARDER_LOCAL_PPROF") // the invalidator and the cache-nodes run in this process
	if n, err := bytesize.Parse(*nodeMemory); err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "local: -cache-node-memory %q: want a positive size such as 64MiB\n", *nodeMemory)
		os.Exit(2)
	} else {
		cfg.CacheNodeMemory = n
	}
	if *pgSettings != "" {
		cfg.PostgresSettings = map[string]string{}
		for _, kv := range strings.Split(*pgSettings, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fmt.Fprintf(os.Stderr, "local: -pg-settings: %q is not name=value\n", kv)
				os.Exit(2)
			}
			cfg.PostgresSettings[k] = v
		}
	}
	if cfg.NATSBin == "embedded" {
		cfg.NATSBin = ""
	}
	if err := run(verb, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "local:", err)
		os.Exit(1)
	}
}

// short is a peer ID's last 8 characters.
func short(id string) string {
	if len(id) <= 8 {
		return id
	}
	return "…" + id[len(id)-8:]
}

func run(verb string, cfg Config) error {
	// LARDER_CPUPROFILE profiles the stack's own process (the invalidator
	// and the cache-node run in it) until it stops: for the benchmarks.
	if path := os.Getenv("LARDER_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()

	urls := s.URLs()
	names := make([]string, 0, len(urls))
	for k := range urls {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Printf("Larder local stack is up (data in %s)\n", cfg.Dir)
	for _, k := range names {
		fmt.Printf("  %-27s %s\n", k, secret.RedactURL(urls[k]))
	}
	fmt.Printf("  (also written, with the passwords, to %s; credentials in %s)\n", s.EnvFile(), s.Creds.Dir)
	fmt.Printf("  logs of the invalidator and the cache-node: %s\n", s.LogDir())
	if p := s.IdentityProblem(); p != "" {
		fmt.Printf("\nThe invalidator is waiting: %s\nRun the statements above with psql \"$LARDER_PG_URL\" (it retries every 3 s), or restart with -fix-replica-identity.\n\n", p)
	}

	if verb == "demo" {
		r, err := s.Smoke(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("PostgreSQL %s, wal_level=%s: larder_demo now holds %d row(s)\n", r.PostgresVersion, r.WALLevel, r.DemoRows)
		fmt.Printf("JetStream acknowledged message #%d on stream LARDER_SMOKE\n", r.JetStreamSeq)
		fmt.Printf("Redis counter larder:smoke:runs = %d\n", r.RedisRuns)
		fmt.Printf("Invalidator: the insert (commit LSN %s) was invalidated on NATS %s after COMMIT returned\n", r.InvalidationLSN, r.InvalidationDelay.Round(time.Microsecond))
		newest := r.Pins[len(r.Pins)-1]
		fmt.Printf("Pincushion: %d exact pinned snapshot(s); newest %s at LSN %s\n", len(r.Pins), newest.SnapshotID, pglogrepl.LSN(newest.LSN))
		fmt.Printf("Cache-node: count(*) = %s computed at that pin, put and served; after an INSERT it is valid on [%s, %s) and a newer read misses (%s)\n",
			r.CachedCount, pglogrepl.LSN(r.CachedLo), pglogrepl.LSN(r.CachedHi), r.NewerMiss)
		if o := r.Overlay; o != nil {
			fmt.Printf("Overlay: %d cache-nodes, node A %s (%s) and node B %s (%s)\n", o.MembersSeenByOne, short(o.Home), o.HomeAddr, short(o.Master), o.MasterAddr)
			fmt.Printf("Overlay: key %s mastered by node B, put and read through node A: %q, served by its master (node B holds %d → %d keys, node A %d → %d)\n",
				o.Key, o.Value, o.MasterKeys[0], o.MasterKeys[1], o.HomeKeys[0], o.HomeKeys[1])
		}
		fmt.Printf("database/sql, driver \"larder\", LARDER_DSN: count(*) = %d (a snapshot within the staleness limit); after an INSERT through it, %d (read your writes)\n", r.DriverCounts[0], r.DriverCounts[1])
		if s.ProxyURL() != "" {
			counts, hits, err := s.PsqlThroughFront(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("psql \"$LARDER_PROXY_URL\" (the PostgreSQL wire front), BEGIN READ ONLY; SELECT count(*) FROM larder_demo; COMMIT, twice: %s; %d of the two reads served from the cache\n", strings.Join(counts, " and "), hits)
		}
	} else {
		fmt.Println("Ctrl-C or SIGTERM stops it.")
		<-ctx.Done()
	}
	if err := s.Close(); err != nil {
		return err
	}
	fmt.Println("Larder local stack stopped cleanly.")
	return nil
}
