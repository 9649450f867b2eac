package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/invalidation"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

type options struct {
	listen, natsURL, prefix, store, metrics, logLevel string
	memory                                            int64
	maxFrame                                          int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	var memory string
	fs := flag.NewFlagSet("cache-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7070", "address to serve the cache-node protocol on")
	fs.StringVar(&o.natsURL, "nats", envOr("LARDER_NATS_URL", nats.DefaultURL), "NATS URL (env LARDER_NATS_URL)")
	fs.StringVar(&o.prefix, "prefix", invalidation.DefaultPrefix, "NATS subject prefix (the invalidator's)")
	fs.StringVar(&o.store, "store", "memory", `"memory", or a Redis URL (redis://host:port/db) to front`)
	fs.StringVar(&memory, "memory", "256MiB", "byte budget (memory) or Redis maxmemory (redis): a number with an optional KiB, MiB or GiB suffix")
	fs.StringVar(&o.metrics, "metrics", "127.0.0.1:9189", "address of the Prometheus /metrics endpoint (empty: none)")
	fs.IntVar(&o.maxFrame, "max-frame", protocol.DefaultMaxFrame, "largest request or answer frame, bytes")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var err error
	if o.memory, err = parseBytes(memory); err != nil {
		return o, fmt.Errorf("--memory: %w", err)
	}
	if err := invalidation.ValidPrefix(o.prefix); err != nil {
		return o, err
	}
	if o.store != "memory" && !strings.HasPrefix(o.store, "redis://") && !strings.HasPrefix(o.store, "rediss://") {
		return o, fmt.Errorf("--store %q: want memory or a redis:// URL", o.store)
	}
	if o.maxFrame < 1<<10 {
		return o, errors.New("--max-frame must be at least 1KiB")
	}
	return o, nil
}

func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive size", s)
	}
	return n * mult, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "cache-node:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "cache-node: --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := daemon.Run(ctx, o.daemon(), log, nil); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

func (o options) daemon() daemon.Options {
	return daemon.Options{Listen: o.listen, NATS: o.natsURL, Prefix: o.prefix, Store: o.store, Memory: o.memory, Metrics: o.metrics, MaxFrame: o.maxFrame}
}
