package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--pg is required"},
		{[]string{"--pg", "postgres://x", "--prefix", "a b"}, "not a valid subject prefix"},
		{[]string{"--pg", "postgres://x", "--pin-budget", "0"}, "pin budget"},
		{[]string{"--pg", "postgres://x", "extra"}, "unexpected arguments"},
		{[]string{"--pg", "postgres://x", "--quma", "/no/such/file.json", "--metrics", ""}, "no/such/file.json"},
		{[]string{"--pg", "postgres://x", "--nats-nkey", "/no/such/seed.nk"}, "--nats-nkey"},
		{[]string{"--pg", "postgres://x", "--pg-password-file", "/no/such/pw"}, "--pg-password-file"},
		{[]string{"--pg", "host=x", "--pg-password-file", "/dev/null"}, "--pg-password-file"},
	} {
		var out bytes.Buffer
		if code := run(c.args, &out); code != exitConfig || !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: exit %d, output %q; want exit %d mentioning %q", c.args, code, out.String(), exitConfig, c.want)
		}
	}
}

func TestRefusesTablesWithoutUsableIdentity(t *testing.T) {
	url := testenv.Database(t, env.PG)
	exec1(t, url, `CREATE TABLE plain (v int)`)
	var out bytes.Buffer
	code := run([]string{"--pg", url, "--nats", env.NATS.URL(), "--slot", "refuse", "--publication", "refuse", "--prefix", "refuse", "--metrics", "", "--pins=false"}, &out)
	if code != exitConfig || !strings.Contains(out.String(), "ALTER TABLE public.plain REPLICA IDENTITY FULL") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}

func exec1(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// killRuns numbers TestKillDuringWriteBurst's runs in this process.
var killRuns atomic.Int64

// TestKillDuringWriteBurst kills the invalidator binary with SIGKILL while
// writers commit, restarts it, and requires every committed transaction
// to have been published at least once.
func TestKillDuringWriteBurst(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "invalidator")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	url := testenv.Database(t, env.PG)
	exec1(t, url, `CREATE TABLE t (id int PRIMARY KEY, v int); ALTER TABLE t REPLICA IDENTITY FULL`)
	// Names of this run's own: a second run in the process (-count) must
	// not read the first one's stream.
	prefix := fmt.Sprintf("kill%d", killRuns.Add(1))
	args := []string{"--pg", url, "--nats", env.NATS.URL(), "--slot", prefix, "--publication", prefix, "--prefix", prefix,
		"--metrics", "", "--heartbeat", "20ms", "--pin-interval", "100ms", "--log-level", "warn"}
	var logs bytes.Buffer
	var logMu sync.Mutex
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, args...)
		w := &lockedWriter{mu: &logMu, w: &logs}
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	cmd := start()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()

	// Read the stream from its beginning.
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	published := map[uint32]map[string]int{}
	var lastHB atomic.Uint64
	var cons jetstream.Consumer
	for deadline := time.Now().Add(60 * time.Second); ; {
		cons, err = js.OrderedConsumer(context.Background(), invalidation.StreamName(prefix), jetstream.OrderedConsumerConfig{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		d, err := invalidation.Decode(m.Data())
		if err != nil {
			t.Errorf("undecodable message: %v", err)
			return
		}
		if d.Txn != nil {
			mu.Lock()
			if published[d.Txn.XID] == nil {
				published[d.Txn.XID] = map[string]int{}
			}
			published[d.Txn.XID][m.Subject()]++
			mu.Unlock()
		} else {
			lastHB.Store(d.Heartbeat.LSN)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitHB := func(lsn uint64) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); lastHB.Load() < lsn; {
			if time.Now().After(deadline) {
				t.Fatalf("no heartbeat past %X (last %X)\n%s", lsn, lastHB.Load(), logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitHB(1) // replicating

	// Writers: each transaction records its xid.
	ctx, stopWriters := context.WithCancel(context.Background())
	var committed sync.Map
	var nextID atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(context.Background(), url)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				id := nextID.Add(1)
				var xid int64
				err := pgx.BeginFunc(context.Background(), conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(context.Background(), `INSERT INTO t VALUES ($1, 0)`, id); err != nil {
						return err
					}
					return tx.QueryRow(context.Background(), `SELECT txid_current()`).Scan(&xid)
				})
				if err != nil {
					t.Error(err)
					return
				}
				committed.Store(uint32(xid), id)
			}
		}()
	}
	count := func() int {
		n := 0
		committed.Range(func(any, any) bool { n++; return true })
		return n
	}
	for count() < 500 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	atKill := count()
	for count() < atKill+500 {
		time.Sleep(10 * time.Millisecond)
	}
	cmd = start()
	for count() < atKill+1500 {
		time.Sleep(10 * time.Millisecond)
	}
	stopWriters()
	wg.Wait()

	var end string
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(context.Background(), `SELECT (pg_current_wal_lsn() - '0/0')::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	var endLSN uint64
	fmt.Sscan(end, &endLSN)
	waitHB(endLSN)

	mu.Lock()
	defer mu.Unlock()
	missing, dups := 0, 0
	committed.Range(func(k, _ any) bool {
		subjects := published[k.(uint32)]
		if len(subjects) == 0 {
			missing++
		}
		for _, n := range subjects {
			if n > 1 {
				dups++
				break
			}
		}
		return true
	})
	t.Logf("%d transactions committed (%d before the kill); %d published more than once after the restart", count(), atKill, dups)
	if missing > 0 {
		t.Fatalf("%d committed transactions were never published", missing)
	}

	// A graceful stop: SIGTERM, exit 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Secrets come from files, so that the command line (visible to every
// user of the machine) need not carry them.
func TestSecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pg.pw")
	if err := os.WriteFile(pw, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := parseFlags([]string{"--pg", "postgres://larder@db:5432/app?sslmode=disable", "--pg-password-file", pw}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.PG != "postgres://larder:s3cr3t@db:5432/app?sslmode=disable" {
		t.Fatalf("--pg with the password from the file: %q", o.PG)
	}
}
