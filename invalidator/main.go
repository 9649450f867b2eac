package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/invalidator/pincushion"
	"github.com/larderdb/larder/invalidator/publisher"
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

type options struct {
	pg, natsURL, quma, slot, publication, tables, prefix, metrics, logLevel string
	heartbeat, streamMaxAge, pinInterval, maxStaleness                      time.Duration
	fixIdentity, streamMemory, pins                                         bool
	pinBudget                                                               int
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("invalidator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.pg, "pg", os.Getenv("LARDER_PG"), "PostgreSQL URL of a user that may replicate (env LARDER_PG)")
	fs.StringVar(&o.natsURL, "nats", envOr("LARDER_NATS", nats.DefaultURL), "NATS URL (env LARDER_NATS)")
	fs.StringVar(&o.quma, "quma", "", "QUMA file (qumaana analyze --format json): the tag column sets; default: each table's primary and unique keys")
	fs.StringVar(&o.slot, "slot", "larder_invalidator", "replication slot (created when missing)")
	fs.StringVar(&o.publication, "publication", "larder_invalidator", "publication (created when missing)")
	fs.StringVar(&o.tables, "tables", "", "comma-separated schema.table list for a new publication (default: all tables)")
	fs.StringVar(&o.prefix, "prefix", invalidation.DefaultPrefix, "NATS subject prefix")
	fs.DurationVar(&o.heartbeat, "heartbeat", 75*time.Millisecond, "heartbeat interval (50ms–100ms recommended)")
	fs.BoolVar(&o.fixIdentity, "fix-replica-identity", false, "run the ALTER TABLE … REPLICA IDENTITY FULL the start-up check asks for")
	fs.DurationVar(&o.streamMaxAge, "stream-max-age", time.Hour, "how long JetStream keeps invalidations for nodes to replay")
	fs.BoolVar(&o.streamMemory, "stream-memory", false, "keep the JetStream stream in memory instead of on disk")
	fs.StringVar(&o.metrics, "metrics", "127.0.0.1:9188", "address of the Prometheus /metrics endpoint (empty: none)")
	fs.BoolVar(&o.pins, "pins", true, "run the pincushion")
	fs.DurationVar(&o.pinInterval, "pin-interval", pincushion.DefaultInterval, "a new pin every interval (100ms–250ms)")
	fs.DurationVar(&o.maxStaleness, "max-staleness", pincushion.DefaultMaxStaleness, "pins are kept this long")
	fs.IntVar(&o.pinBudget, "pin-budget", pincushion.DefaultBudget, "at most this many pins (open connections)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.pg == "" {
		return nil, errors.New("--pg is required (a PostgreSQL URL)")
	}
	if o.heartbeat <= 0 || o.pinInterval <= 0 || o.maxStaleness <= 0 || o.pinBudget < 1 {
		return nil, errors.New("--heartbeat, --pin-interval, --max-staleness must be positive and --pin-budget at least 1")
	}
	if err := invalidation.ValidPrefix(o.prefix); err != nil {
		return nil, err
	}
	return o, nil
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
			return exitOK
		}
		fmt.Fprintln(stderr, "invalidator:", err)
		return exitConfig
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "invalidator: --log-level:", err)
		return exitConfig
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, o, log); err != nil {
		log.Error("stopped", "err", err)
		var ie *publisher.IdentityError
		if errors.As(err, &ie) || errors.Is(err, errConfig) {
			return exitConfig
		}
		return exitFailed
	}
	log.Info("stopped")
	return exitOK
}

var errConfig = errors.New("configuration")

func serve(ctx context.Context, o *options, log *slog.Logger) error {
	var sets map[string][][]string
	if o.quma != "" {
		var err error
		if sets, err = publisher.ReadTagColumnsFile(o.quma); err != nil {
			return fmt.Errorf("%w: %v", errConfig, err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	restarts := prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_restarts_total", Help: "Replication sessions restarted after an error."})
	reg.MustRegister(restarts)

	if o.metrics != "" {
		ln, err := net.Listen("tcp", o.metrics)
		if err != nil {
			return fmt.Errorf("%w: metrics listener: %v", errConfig, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	}

	nc, err := nats.Connect(o.natsURL, nats.Name("larder-invalidator"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("NATS reconnected") }))
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", o.natsURL, err)
	}
	defer nc.Close()

	commits := pincushion.NewCommitLog(pincushion.DefaultRetain)
	var tables []string
	if o.tables != "" {
		tables = strings.Split(o.tables, ",")
	}
	pub, err := publisher.New(publisher.Config{
		ConnString:         o.pg,
		Slot:               o.slot,
		Publication:        o.publication,
		Tables:             tables,
		TagColumns:         sets,
		FixReplicaIdentity: o.fixIdentity,
		NATS:               nc,
		SubjectPrefix:      o.prefix,
		Heartbeat:          o.heartbeat,
		StreamMaxAge:       o.streamMaxAge,
		StreamMemory:       o.streamMemory,
		Commits:            commits,
		Log:                log,
		Metrics:            reg,
	})
	if err != nil {
		return fmt.Errorf("%w: %v", errConfig, err)
	}

	cushionDone := make(chan error, 1)
	if o.pins {
		cushion, err := pincushion.New(pincushion.Config{
			ConnString:    o.pg,
			NATS:          nc,
			SubjectPrefix: o.prefix,
			Interval:      o.pinInterval,
			MaxStaleness:  o.maxStaleness,
			Budget:        o.pinBudget,
			Log:           log,
			Metrics:       reg,
		}, commits)
		if err != nil {
			return fmt.Errorf("%w: %v", errConfig, err)
		}
		go func() { cushionDone <- cushion.Run(ctx) }()
	} else {
		cushionDone <- nil
	}

	// The publisher resumes from the slot after any failure; only a
	// configuration error (replica identity) stops the process.
	backoff := time.Second
	for {
		start := time.Now()
		err := pub.Run(ctx)
		if ctx.Err() != nil {
			break
		}
		var ie *publisher.IdentityError
		if errors.As(err, &ie) {
			return err
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		restarts.Inc()
		log.Error("replication session failed; resuming from the slot", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	if err := <-cushionDone; err != nil {
		return fmt.Errorf("pincushion: %w", err)
	}
	return nil
}
