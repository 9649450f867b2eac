package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/secret"
	"github.com/larderdb/larder/invalidator/service"
)

// exit codes
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (service.Options, string, error) {
	o := service.Defaults()
	var tables, logLevel string
	fs := flag.NewFlagSet("invalidator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.PG, "pg", os.Getenv("LARDER_PG_URL"), "PostgreSQL URL of a user that may replicate (env LARDER_PG_URL)")
	fs.StringVar(&o.NATS, "nats", envOr("LARDER_NATS_URL", o.NATS), "NATS URL (env LARDER_NATS_URL)")
	fs.StringVar(&o.QUMA, "quma", "", "QUMA file (qumaana analyze --format json): the tag column sets; default: each table's primary and unique keys")
	fs.StringVar(&o.Slot, "slot", o.Slot, "replication slot (created when missing)")
	fs.StringVar(&o.Publication, "publication", o.Publication, "publication (created when missing)")
	fs.StringVar(&tables, "tables", "", "comma-separated schema.table list for a new publication (default: all tables)")
	fs.StringVar(&o.Prefix, "prefix", o.Prefix, "NATS subject prefix")
	fs.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "heartbeat interval (50ms–100ms recommended)")
	fs.BoolVar(&o.FixIdentity, "fix-replica-identity", false, "run the ALTER TABLE … REPLICA IDENTITY FULL the start-up check asks for")
	ddlTrigger := fs.Bool("ddl-trigger", true, "install (needs a superuser once) and require the DDL event triggers; false: a schema change flushes its table only at the table's next row change")
	fs.DurationVar(&o.StreamMaxAge, "stream-max-age", o.StreamMaxAge, "how long JetStream keeps invalidations for nodes to replay")
	fs.BoolVar(&o.StreamMemory, "stream-memory", false, "keep the JetStream stream in memory instead of on disk")
	fs.StringVar(&o.Metrics, "metrics", o.Metrics, "address of the Prometheus /metrics endpoint (empty: none)")
	fs.BoolVar(&o.Pins, "pins", o.Pins, "run the pincushion")
	fs.DurationVar(&o.PinInterval, "pin-interval", o.PinInterval, "a new pin every interval (100ms–250ms)")
	fs.DurationVar(&o.MaxStaleness, "max-staleness", o.MaxStaleness, "pins are kept this long")
	fs.IntVar(&o.PinBudget, "pin-budget", o.PinBudget, "at most this many pins, each an open connection (PostgreSQL sees up to this many plus 9: one candidate being checked and 8 idle connections kept for reuse)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	natsNkey := fs.String("nats-nkey", os.Getenv("LARDER_NATS_NKEY"), "file holding the invalidator's NATS nkey seed (env LARDER_NATS_NKEY)")
	pgPasswordFile := fs.String("pg-password-file", os.Getenv("LARDER_PG_PASSWORD_FILE"), "file holding the PostgreSQL password, so that --pg need not carry it (env LARDER_PG_PASSWORD_FILE)")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	if *natsNkey != "" {
		opt, err := nats.NkeyOptionFromSeed(*natsNkey)
		if err != nil {
			return o, "", fmt.Errorf("--nats-nkey: %w", err)
		}
		o.NATSOptions = append(o.NATSOptions, opt)
	}
	if fs.NArg() > 0 {
		return o, "", fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.PG == "" {
		return o, "", errors.New("--pg is required (a PostgreSQL URL)")
	}
	if *pgPasswordFile != "" {
		pw, err := secret.FromFile(*pgPasswordFile)
		if err != nil {
			return o, "", fmt.Errorf("--pg-password-file: %w", err)
		}
		u, err := url.Parse(o.PG)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return o, "", errors.New("--pg-password-file needs --pg as a postgres:// URL")
		}
		user := ""
		if u.User != nil {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, pw)
		o.PG = u.String()
	}
	o.NoDDLTrigger = !*ddlTrigger
	if tables != "" {
		o.Tables = strings.Split(tables, ",")
	}
	if err := o.Validate(); err != nil {
		return o, "", err
	}
	return o, logLevel, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(args []string, stderr io.Writer) int {
	o, logLevel, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "invalidator:", err)
		return exitConfig
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		fmt.Fprintln(stderr, "invalidator: --log-level:", err)
		return exitConfig
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := service.Run(ctx, o, log); err != nil {
		log.Error("stopped", "err", err)
		if service.IsConfig(err) {
			return exitConfig
		}
		return exitFailed
	}
	log.Info("stopped")
	return exitOK
}
