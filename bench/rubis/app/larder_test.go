package app

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/cache-node/daemon"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/invalidator/service"
	"github.com/larderdb/larder/qumaana/quma"
)

// Every page renders the same in every cached mode (larder, larder-nocons,
// local-only) as on plain PostgreSQL, the first time (misses) and again
// (hits).
func TestSamePagesThroughLarder(t *testing.T) {
	pgURL := loadTiny(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The QUMA file: the RUBiS schema and its templates.
	schema, err := quma.LoadDDL(datagen.SchemaSQL())
	if err != nil {
		t.Fatal(err)
	}
	work, err := quma.ReadTemplates(strings.NewReader(datagen.TemplatesSQL()), "templates.sql")
	if err != nil {
		t.Fatal(err)
	}
	sol, err := quma.AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	qumaFile := filepath.Join(t.TempDir(), "quma.json")
	out, err := os.Create(qumaFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := sol.WriteJSON(out); err != nil {
		t.Fatal(err)
	}
	out.Close()

	o := service.Defaults()
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication, o.Metrics = pgURL, env.NATS.URL(), "rubis", "rubis", "rubis", ""
	o.QUMA, o.Heartbeat, o.PinInterval = qumaFile, 20*time.Millisecond, 100*time.Millisecond
	invDone := make(chan error, 1)
	go func() { invDone <- service.Run(ctx, o, quiet) }()
	defer func() { cancel(); <-invDone }()
	ready := make(chan string, 1)
	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- daemon.Run(ctx, daemon.Options{Listen: "127.0.0.1:0", NATS: env.NATS.URL(), Prefix: "rubis", Store: "memory", Memory: 32 << 20}, quiet, ready)
	}()
	defer func() { cancel(); <-nodeDone }()
	var node string
	select {
	case node = <-ready:
	case err := <-nodeDone:
		t.Fatal(err)
	}

	dsn := func(mode string) string {
		q := url.Values{}
		q.Set("larder.nats", env.NATS.URL())
		q.Set("larder.quma", qumaFile)
		q.Set("larder.prefix", "rubis")
		q.Set("larder.staleness", "30s")
		q.Set("application_name", mode)
		switch mode {
		case "larder":
			q.Set("larder.nodes", node)
		case "larder-nocons":
			q.Set("larder.nodes", node)
			larder.EnableUnsafeBenchmarkAblation()
			q.Set(larder.UnsafeAblationParam, "true")
		case "local-only":
			q.Set("larder.l1", "8388608")
		}
		return pgURL + "&" + q.Encode()
	}
	direct, err := sql.Open("pgx", pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	// One clock for both, so that $now is the same.
	now := time.Now()
	clock := func() time.Time { return now }
	viaPG := newServer(t, direct, Config{Clock: clock})
	for _, mode := range []string{"larder", "larder-nocons", "local-only", "larder-functions"} {
		functions := mode == "larder-functions"
		if functions {
			mode = "larder"
		}
		cached, err := sql.Open(larder.DriverName, dsn(mode))
		if err != nil {
			t.Fatal(err)
		}
		defer cached.Close()
		viaLarder := newServer(t, cached, Config{Clock: clock, Functions: functions, ReadContext: func(ctx context.Context) context.Context { return larder.WithStaleness(ctx, 30*time.Second) }})
		// Every pin is taken after the load (the invalidator started after
		// it); before the first pin, transactions read fresh snapshots.
		for round := 0; round < 2; round++ {
			for _, v := range readVisits() {
				a, b := get(t, viaPG, v), get(t, viaLarder, v)
				if a != b {
					t.Fatalf("%s, round %d, %s?%s differs:\n%s\n---\n%s", mode, round, v.path, v.params.Encode(), diffHint(a, b), b)
				}
			}
		}
	}
}

func diffHint(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d:\n  %s\n  %s", i+1, la[i], lb[i])
		}
	}
	return "lengths differ"
}
