package service

import (
	"context"
	"fmt"
	"log/slog"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
)

// healRuns numbers TestRecoversWhenADependencyReturns's runs (-count).
var healRuns atomic.Int64

// A dependency that was away long enough for the wait between sessions
// to grow is used again within a few seconds of its return: the wait is
// capped low, and starts again after a session that got through.
func TestRecoversWhenADependencyReturns(t *testing.T) {
	const down = 16 * time.Second // the wait would have grown to 16 s
	const bound = 10 * time.Second
	for _, dep := range []string{"postgres", "nats"} {
		t.Run(dep, func(t *testing.T) {
			ctx := context.Background()
			dir, err := testenv.TempDir()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			pgCfg := servers.DefaultPostgresConfig(filepath.Join(dir, "pg"))
			pg, err := servers.StartPostgres(ctx, pgCfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pg.Close() })
			natsCfg := servers.DefaultNATSConfig(filepath.Join(dir, "nats"))
			ns, err := servers.StartNATS(ctx, natsCfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ns.Close() })
			url := pg.URL("postgres")
			exec := func(sql string) {
				t.Helper()
				conn, err := pgx.Connect(ctx, url)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			exec(`CREATE TABLE t (id int PRIMARY KEY, v int)`)

			prefix := fmt.Sprintf("heal%d", healRuns.Add(1))
			o := Defaults()
			o.PG, o.NATS, o.Prefix = url, ns.URL(), prefix
			o.Heartbeat = 20 * time.Millisecond
			o.Metrics, o.Pins = "", false
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- Run(rctx, o, slog.New(slog.NewTextHandler(testWriter{t}, nil))) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("service: %v", err)
				}
			})

			nc, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			changes := make(chan *nats.Msg, 1024)
			sub, err := nc.ChanSubscribe(invalidation.TagSubject(prefix, "public.t"), changes)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			// awaitChange waits for the invalidation of a row written now.
			awaitChange := func(id int, within time.Duration) {
				t.Helper()
				exec(fmt.Sprintf("INSERT INTO t VALUES (%d, 0)", id))
				timeout := time.After(within)
				for {
					select {
					case <-changes:
						return
					case err := <-done:
						t.Fatalf("service stopped: %v", err)
					case <-timeout:
						t.Fatalf("row %d: no invalidation within %s", id, within)
					}
				}
			}
			awaitChange(1, time.Minute)

			switch dep {
			case "postgres":
				if err := pg.Close(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(down)
				pgCfg.Port = pg.Port()
				if pg, err = servers.StartPostgres(ctx, pgCfg); err != nil {
					t.Fatal(err)
				}
			case "nats":
				if err := ns.Close(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(down)
				natsCfg.Port = ns.Port()
				if ns, err = servers.StartNATS(ctx, natsCfg); err != nil {
					t.Fatal(err)
				}
			}
			back := time.Now()
			for !nc.IsConnected() { // the test's own subscription
				if time.Since(back) > time.Minute {
					t.Fatal("the test's NATS connection did not reconnect")
				}
				time.Sleep(10 * time.Millisecond)
			}
			for len(changes) > 0 {
				<-changes
			}
			awaitChange(2, time.Minute)
			took := time.Since(back)
			t.Logf("%s away %s: invalidations flow again %s after its return", dep, down, took.Round(time.Millisecond))
			if took > bound {
				t.Errorf("%s: invalidations flowed again %s after its return; want within %s", dep, took.Round(time.Millisecond), bound)
			}
		})
	}
}

// roleSeq numbers the roles TestMissingPrivilegeStops makes.
var roleSeq atomic.Int64

// A role that may not create the publication, or may not replicate, stops
// the invalidator at once with a configuration error that names the fix;
// it is not retried for ever.
func TestMissingPrivilegeStops(t *testing.T) {
	for _, c := range []struct {
		name   string
		setup  string // as a superuser; %s is the role
		tables []string
		want   string
	}{
		{"all tables", "", nil, `CREATE PUBLICATION "priv" FOR ALL TABLES;`},
		{"some tables", "", []string{"public.t"}, `GRANT CREATE ON DATABASE`},
		{"replication", "CREATE PUBLICATION priv FOR ALL TABLES; ALTER ROLE %[1]s NOREPLICATION", nil, `REPLICATION;`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			role := fmt.Sprintf("larder_priv_%d_%d", os.Getpid(), roleSeq.Add(1))
			admin, err := pgx.Connect(ctx, env.PG.URL("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { admin.Close(context.Background()) })
			if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN REPLICATION"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { // after the database's drop
				if _, err := admin.Exec(context.Background(), "DROP ROLE "+role); err != nil {
					t.Errorf("drop role: %v", err)
				}
			})
			dbURL := testenv.Database(t, env.PG)
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			setup := "CREATE TABLE t (id int PRIMARY KEY); GRANT SELECT ON t TO " + role
			if c.setup != "" {
				setup += "; " + fmt.Sprintf(c.setup, role)
			}
			if _, err := conn.Exec(ctx, setup); err != nil {
				t.Fatal(err)
			}
			u, err := neturl.Parse(dbURL)
			if err != nil {
				t.Fatal(err)
			}
			u.User = neturl.User(role)

			o := Defaults()
			o.PG, o.NATS, o.Prefix = u.String(), env.NATS.URL(), "priv"
			o.Slot, o.Publication, o.Tables = "priv", "priv", c.tables
			o.NoDDLTrigger = true // event triggers need a superuser too (a test of their own)
			o.Metrics, o.Pins = "", false
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err = Run(rctx, o, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
			if rctx.Err() != nil {
				t.Fatalf("still retrying after 30 s (err %v)", err)
			}
			if !IsConfig(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("stopped with %v (configuration error: %v); want a configuration error naming %q", err, IsConfig(err), c.want)
			}
			t.Logf("%v", err)
		})
	}
}

// A configuration error found once the pincushion runs (here a table
// whose replica identity cannot give its old rows) stops the pincushion
// with the publisher: its pins' connections close. A caller that runs
// Run again and again while it waits for the fix (the local stack, every
// 3 s) left one pincushion and its pins behind at each try, until
// PostgreSQL refused every connection ("too many clients").
func TestConfigErrorStopsThePincushion(t *testing.T) {
	ctx := context.Background()
	dbURL := testenv.Database(t, env.PG)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE noid (v int)"); err != nil { // no key: no replica identity
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	o := Defaults()
	o.PG, o.NATS, o.Prefix = dbURL, env.NATS.URL(), "noid"
	o.Slot, o.Publication = "noid", "noid"
	o.NoDDLTrigger = true
	o.Metrics = ""
	o.PinInterval = 20 * time.Millisecond
	// live lives on after Run returns, as the local stack's context does.
	live, stop := context.WithCancel(ctx)
	defer stop()
	for try := 0; try < 3; try++ {
		done := make(chan error, 1)
		go func() { done <- Run(live, o, slog.New(slog.NewTextHandler(testWriter{t}, nil))) }()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("Run still running after 30 s; want it stopped by a configuration error")
		}
		if !IsConfig(err) {
			t.Fatalf("Run: %v; want a configuration error", err)
		}
	}
	// What a pincushion left running would hold: pins taken every 20 ms.
	time.Sleep(500 * time.Millisecond)
	var others int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'", db).Scan(&others); err != nil {
		t.Fatal(err)
	}
	if others != 0 {
		t.Fatalf("%d connections to the database are still open after Run stopped on a configuration error three times", others)
	}
}
