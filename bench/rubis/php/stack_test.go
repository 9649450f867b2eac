package php

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/cache-node/daemon"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/client-lib/pgfront"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/service"
	"github.com/larderdb/larder/qumaana/quma"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// requirePHP returns the php binary, failing the test with the install
// command when PHP or its pgsql extension is missing.
func requirePHP(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("php")
	if err != nil {
		t.Fatalf("php is not installed: %s", InstallHint)
	}
	if err := checkExtensions(context.Background(), bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// requirePHPUnit returns the phpunit binary, failing the test with the
// install command when it is missing.
func requirePHPUnit(t testing.TB) string {
	t.Helper()
	requirePHP(t)
	bin, err := exec.LookPath("phpunit")
	if err != nil {
		t.Fatalf("phpunit is not installed: %s", InstallHint)
	}
	return bin
}

var tiny = datagen.Size{Users: 50, ActiveItems: 40, OldItems: 40, Categories: 5, Regions: 62, MaxDescription: 50, MaxComment: 50}

// loadTiny makes a database with a tiny RUBiS in it.
func loadTiny(t testing.TB) string {
	t.Helper()
	u := testenv.Database(t, env.PG)
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := datagen.Load(context.Background(), conn, datagen.Config{Size: tiny, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	return u
}

var stackSeq atomic.Int64

// larderStack is Larder over one database: the invalidator, a cache-node,
// the library and a front, all real and in this process.
type larderStack struct {
	front  *pgfront.Front
	client *larder.Client
	// frontURL is the database through the front, as libpq reads it.
	frontURL string
}

// startLarder runs Larder over the database at pgURL, with the QUMA file
// analyzed from ddl and the templates (SQL text, one statement each), and
// an L1 of l1 bytes (0: none, the cache-node only).
func startLarder(t testing.TB, pgURL, ddl, templates string, l1 int64) *larderStack {
	t.Helper()
	ctx := context.Background()
	schema, err := quma.LoadDDL(ddl)
	if err != nil {
		t.Fatal(err)
	}
	work, err := quma.ReadTemplates(strings.NewReader(templates), "templates.sql")
	if err != nil {
		t.Fatal(err)
	}
	sol, err := quma.AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	qumaFile := filepath.Join(t.TempDir(), "quma.json")
	f, err := os.Create(qumaFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := sol.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	prefix := fmt.Sprintf("rubisphp%d", stackSeq.Add(1))
	bg, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	o := service.Defaults()
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication, o.Metrics = pgURL, env.NATS.URL(), prefix, prefix, prefix, ""
	o.QUMA, o.Heartbeat, o.PinInterval = qumaFile, 20*time.Millisecond, 100*time.Millisecond
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := service.Run(bg, o, quiet); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("invalidator: %v", err)
		}
	}()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- daemon.Run(bg, daemon.Options{Listen: "127.0.0.1:0", NATS: env.NATS.URL(), Prefix: prefix, Store: "memory", Memory: 32 << 20}, quiet, ready)
	}()
	var node string
	select {
	case node = <-ready:
	case err := <-done:
		t.Fatalf("cache-node: %v", err)
	}

	client, err := larder.Open(ctx, larder.Config{PostgresURL: pgURL, NATSURL: env.NATS.URL(), Prefix: prefix,
		Nodes: []string{node}, QUMA: qumaFile, Staleness: 30 * time.Second, L1Bytes: l1, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)

	cfg := pgfront.DefaultConfig()
	cfg.Listen, cfg.Postgres, cfg.Client, cfg.Log = "127.0.0.1:0", "127.0.0.1:"+strconv.Itoa(env.PG.Port()), client, quiet
	front, err := pgfront.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	fdone := make(chan error, 1)
	go func() { fdone <- front.Run(fctx) }()
	t.Cleanup(func() {
		fcancel()
		if err := <-fdone; err != nil {
			t.Errorf("front: %v", err)
		}
	})

	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = front.Addr().String()
	return &larderStack{front: front, client: client, frontURL: u.String()}
}
