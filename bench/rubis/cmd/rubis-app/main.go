// Command rubis-app serves RUBiS over HTTP in one of the benchmark's modes.
//
//	go run ./bench/rubis/cmd/rubis-app --mode direct --pg postgres://…
//	go run ./bench/rubis/cmd/rubis-app --mode larder --dsn "$LARDER_DSN"
//
// Modes: direct (plain PostgreSQL through pgx), larder (consistent),
// larder-nocons (the cache ignores consistency: the "no consistency"
// ablation), local-only (each instance's L1 only, no cache-node).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/larderdb/larder/bench/rubis/app"
	larder "github.com/larderdb/larder/client-lib"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "HTTP address")
	mode := flag.String("mode", "direct", "direct, larder, larder-nocons or local-only")
	pg := flag.String("pg", os.Getenv("LARDER_PG_URL"), "PostgreSQL URL (direct)")
	dsn := flag.String("dsn", os.Getenv("LARDER_DSN"), "larder DSN (the other modes)")
	staleness := flag.Duration("staleness", 30*time.Second, "staleness limit of browsing pages")
	granularity := flag.Duration("now-granularity", time.Minute, "rounding of $now in time-dependent reads")
	sqlNow := flag.Bool("sql-now", false, "use the original end_date >= now() form (uncacheable)")
	flag.Parse()
	db, err := open(*mode, *pg, *dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rubis-app:", err)
		os.Exit(2)
	}
	defer db.Close()
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64) // no reconnect per request
	a, err := app.New(app.Config{DB: db, NowGranularity: *granularity, UseSQLNow: *sqlNow,
		ReadContext: func(ctx context.Context) context.Context { return larder.WithStaleness(ctx, *staleness) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rubis-app:", err)
		os.Exit(2)
	}
	// Each user carries its read-your-writes session in a cookie.
	srv := &http.Server{Addr: *listen, Handler: larder.HTTPSessions(a.Handler()), ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Printf("rubis-app: %s mode on http://%s", *mode, *listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "rubis-app:", err)
		os.Exit(1)
	}
}

// open returns the database of a mode.
func open(mode, pg, dsn string) (*sql.DB, error) {
	switch mode {
	case "direct":
		if pg == "" {
			return nil, errors.New("direct mode needs --pg")
		}
		return sql.Open("pgx", pg)
	case "larder", "larder-nocons", "local-only":
		if dsn == "" {
			return nil, errors.New(mode + " mode needs --dsn (LARDER_DSN from the local stack)")
		}
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, err
		}
		q := u.Query()
		switch mode {
		case "larder-nocons":
			// The ablation that measures what consistency costs.
			larder.EnableUnsafeBenchmarkAblation()
			q.Set(larder.UnsafeAblationParam, "true")
		case "local-only":
			q.Del("larder.nodes")
			if q.Get("larder.l1") == "" {
				q.Set("larder.l1", fmt.Sprint(256<<20))
			}
		}
		u.RawQuery = q.Encode()
		return sql.Open(larder.DriverName, u.String())
	}
	return nil, fmt.Errorf("unknown mode %q: want direct, larder, larder-nocons or local-only", mode)
}
