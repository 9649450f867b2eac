// Command larder-origin serves edge sites' misses next to PostgreSQL: it
// runs each edge transaction's statements at its pin and answers with row
// recipes (package cache-node/origin).
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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/larderdb/larder/cache-node/origin"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/pki"
	"github.com/larderdb/larder/internal/secret"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("larder-origin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:7080", "address to serve edges on")
	pg := fs.String("pg", os.Getenv("LARDER_ORIGIN_PG"), "PostgreSQL URL, the same database (and role) as the edges' (env LARDER_ORIGIN_PG)")
	cert := fs.String("tls-cert", os.Getenv("LARDER_NODE_TLS_CERT"), "the origin's certificate, PEM (env LARDER_NODE_TLS_CERT)")
	key := fs.String("tls-key", os.Getenv("LARDER_NODE_TLS_KEY"), "the origin's private key, PEM (env LARDER_NODE_TLS_KEY)")
	clientCA := fs.String("tls-client-ca", os.Getenv("LARDER_NODE_TLS_CLIENT_CA"), "CA that signs the edges' certificates (env LARDER_NODE_TLS_CLIENT_CA)")
	insecure := fs.Bool("insecure-no-auth", false, "serve plain TCP to anyone who can reach --listen (anyone can then read the database as the origin's role)")
	metrics := fs.String("metrics", "127.0.0.1:9190", "address of the Prometheus /metrics endpoint (empty: none)")
	cfg := origin.DefaultConfig()
	fs.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "edge transactions open at once (each holds a PostgreSQL connection)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "a connection idle this long is closed, ending its transaction")
	fs.DurationVar(&cfg.StatementTimeout, "statement-timeout", cfg.StatementTimeout, "bound on each request's work")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg.Log = log
	if *pg == "" {
		fmt.Fprintln(stderr, "larder-origin: --pg is required")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, *listen, *pg, *cert, *key, *clientCA, *insecure, *metrics, log); err != nil {
		log.Error("larder-origin", "err", secret.Redact(err.Error()))
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg origin.Config, listen, pg, cert, key, clientCA string, insecure bool, metrics string, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	// A connection per open edge transaction, up to --max-sessions.
	c, err := larder.OpenPinned(ctx, larder.PoolSized(pg, cfg.MaxSessions), reg)
	if err != nil {
		return err
	}
	defer c.Close()
	if cert == "" && !insecure {
		return errors.New("--tls-cert, --tls-key and --tls-client-ca are required (or --insecure-no-auth)")
	}
	srv, err := newServer(cfg, c, cert, key, clientCA, insecure)
	if err != nil {
		return err
	}
	defer srv.Close()
	if metrics != "" {
		reg.MustRegister(statsCollector{srv})
		hs := &http.Server{Addr: metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.ListenAndServe() }()
		defer hs.Close()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Info("larder-origin serving", "listen", ln.Addr().String(), "pg", secret.RedactURL(pg))
	return srv.Serve(ctx, ln)
}

func newServer(cfg origin.Config, c *larder.Client, cert, key, clientCA string, insecure bool) (*origin.Server, error) {
	if insecure {
		return origin.New(cfg, c.OriginBackend(), nil)
	}
	t, err := pki.ServerTLS(cert, key, clientCA)
	if err != nil {
		return nil, err
	}
	return origin.New(cfg, c.OriginBackend(), t)
}

// statsCollector exposes the server's counters.
type statsCollector struct{ s *origin.Server }

var descs = map[string]*prometheus.Desc{
	"sessions":   prometheus.NewDesc("larder_origin_sessions_total", "Edge transactions begun at their pins.", nil, nil),
	"statements": prometheus.NewDesc("larder_origin_statements_total", "Statements run for edges.", nil, nil),
	"refetches":  prometheus.NewDesc("larder_origin_refetches_total", "Refetches edges sent.", nil, nil),
	"busy":       prometheus.NewDesc("larder_origin_busy_total", "Begins refused at --max-sessions.", nil, nil),
	"raw":        prometheus.NewDesc("larder_origin_bytes_raw_total", "Bytes of the results run for edges, encoded plainly.", nil, nil),
	"sent":       prometheus.NewDesc("larder_origin_bytes_sent_total", "Bytes of the recipes and fills sent for them.", nil, nil),
}

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s.Stats()
	for name, v := range map[string]int64{"sessions": s.Sessions.Load(), "statements": s.Statements.Load(), "refetches": s.Refetches.Load(),
		"busy": s.Busy.Load(), "raw": s.BytesRaw.Load(), "sent": s.BytesSent.Load()} {
		ch <- prometheus.MustNewConstMetric(descs[name], prometheus.CounterValue, float64(v))
	}
}
