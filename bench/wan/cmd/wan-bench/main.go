// Command wan-bench measures Larder across an emulated WAN (package
// bench/wan): it starts the database's site (PostgreSQL with RUBiS, NATS,
// the invalidator) under --dir, then, for each link setting and
// configuration, the edge (toxiproxy link, origin, cache-node, the RUBiS
// application) in this process, and writes report.md and report.json.
//
//	go run ./bench/wan/cmd/wan-bench --out bench/wan/results
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/bench/wan"
	"github.com/larderdb/larder/internal/invalidation"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "wan-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", ".larder-wan", "the site's data and credentials (wiped at start)")
	pgPort := flag.Int("pg-port", 0, "PostgreSQL's port (0: a free one)")
	natsPort := flag.Int("nats-port", 0, "the hub NATS's port (0: a free one)")
	leafPort := flag.Int("leaf-port", 0, "the hub's leaf node port (0: a free one)")
	preset := flag.String("preset", "txcache-memory", "RUBiS data preset (original, txcache-memory)")
	scale := flag.Float64("scale", 0.1, "data scale")
	settings := flag.String("links", "5Mbps-66ms,20Mbps-33ms,100Mbps-0ms", "link settings, comma-separated (NMbps-RTT)")
	modes := flag.String("modes", strings.Join(wan.Modes, ","), "configurations: direct (a), origin-rows (b), origin-recipes (c)")
	mixes := flag.String("mixes", "browsing,bidding,listing", "page sets: RUBiS's browsing and bidding mixes, the data-heavy listing")
	vus := flag.Int("vus", 8, "emulated users")
	duration := flag.Duration("duration", 30*time.Second, "measured time per run")
	warmup := flag.Duration("warmup", 10*time.Second, "unmeasured time before each run")
	staleness := flag.Duration("staleness", 30*time.Second, "staleness limit of the read-only pages")
	bidEvery := flag.Duration("bid-every", 250*time.Millisecond, "the listing mix's writer: one bid per this")
	leaf := flag.Bool("leaf", true, "the edge's NATS is a leaf node of the hub (its leaf connection across the link); false: the edge connects to the hub across the link")
	out := flag.String("out", "bench/wan/results", "report folder")
	flag.Parse()

	size := map[string]datagen.Size{"original": datagen.Original, "txcache-memory": datagen.TxCacheInMemory}[*preset]
	if size.Users == 0 {
		return fmt.Errorf("unknown preset %q", *preset)
	}
	size = size.Scaled(*scale)
	cfg := wan.Config{Size: size, VUs: *vus, Duration: *duration, Warmup: *warmup, Staleness: *staleness, BidEvery: *bidEvery, Progress: os.Stdout,
		Modes: strings.Split(*modes, ","), Mixes: strings.Split(*mixes, ",")}
	for _, s := range strings.Split(*settings, ",") {
		st, err := wan.ParseSetting(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		cfg.Settings = append(cfg.Settings, st)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(abs, "wan-bench.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, nil))
	fmt.Printf("starting the site in %s (RUBiS %s × %g: %d users, %d active items)\n", abs, *preset, *scale, size.Users, size.ActiveItems)
	site, err := wan.StartSite(ctx, wan.SiteConfig{Dir: filepath.Join(abs, "site"), PGPort: *pgPort, NATSPort: *natsPort, LeafPort: *leafPort, Size: size, Log: log})
	if err != nil {
		return err
	}
	defer site.Close()
	cfg.PGURL, cfg.NATSURL, cfg.QUMA, cfg.Log = site.PGURL, site.NATS.URL(), site.QUMA, log
	cfg.NATSClientSeed, cfg.NATSNodeSeed = site.Seed(invalidation.RoleClient), site.Seed(invalidation.RoleCacheNode)
	if *leaf {
		cfg.Leaf = site.Leaf()
	}
	cfg.Dir = filepath.Join(abs, "edge")
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return err
	}
	start := time.Now()
	runs, err := wan.Bench(ctx, cfg)
	if len(runs) > 0 {
		if werr := write(*out, runs, cfg, *preset, *scale, *leaf, time.Since(start)); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

func write(out string, runs []wan.Run, cfg wan.Config, preset string, scale float64, leaf bool, took time.Duration) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(runs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "report.json"), js, 0o644); err != nil {
		return err
	}
	nats := "the edge's client and cache-node connect to the hub NATS across the link"
	if leaf {
		nats = "the edge's client and cache-node connect to a NATS leaf node at the edge, whose leaf connection crosses the link"
	}
	head := fmt.Sprintf("# Larder over a WAN\n\nRUBiS %s × %g (%d users, %d active items, descriptions up to %d bytes); %d emulated users without think time; "+
		"%s measured after %s of warm-up per run; staleness %s; the listing mix's writer bids every %s; %s; %d CPUs shared with other work; took %s.\n\n",
		preset, scale, cfg.Size.Users, cfg.Size.ActiveItems, cfg.Size.MaxDescription, cfg.VUs, cfg.Duration, cfg.Warmup, cfg.Staleness, cfg.BidEvery, nats, runtime.NumCPU(), took.Round(time.Second))
	md := head + wan.Markdown(runs)
	fmt.Print("\n" + md)
	return os.WriteFile(filepath.Join(out, "report.md"), []byte(md), 0o644)
}
