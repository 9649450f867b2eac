package testenv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true, Redis: true}, &env))
}

// TestPostgresLogicalReplication proves the cluster decodes its WAL: a
// pgoutput slot streams back a row inserted after it was created.
func TestPostgresLogicalReplication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dbURL := testenv.Database(t, env.PG)

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil || walLevel != "logical" {
		t.Fatalf("wal_level = %q, %v; want logical", walLevel, err)
	}
	for _, q := range []string{
		"CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)",
		"CREATE PUBLICATION larder_test FOR TABLE items",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	repl, err := pgconn.Connect(ctx, dbURL+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.Background())
	slot, err := pglogrepl.CreateReplicationSlot(ctx, repl, "larder_test_slot", "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		t.Fatalf("create slot: %v", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO items VALUES (42, 'larder')"); err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, repl, slot.SlotName, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'larder_test'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}

	relations := map[uint32]*pglogrepl.RelationMessage{}
	for {
		msg, err := repl.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		lm, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			t.Fatal(err)
		}
		switch m := lm.(type) {
		case *pglogrepl.RelationMessage:
			relations[m.RelationID] = m
		case *pglogrepl.InsertMessage:
			rel := relations[m.RelationID]
			if rel == nil || rel.RelationName != "items" {
				t.Fatalf("insert into unknown relation %d", m.RelationID)
			}
			got := map[string]string{}
			for i, col := range m.Tuple.Columns {
				got[rel.Columns[i].Name] = string(col.Data)
			}
			if got["id"] != "42" || got["name"] != "larder" {
				t.Fatalf("decoded row %v, want id=42 name=larder", got)
			}
			if xld.WALStart < start {
				t.Fatalf("change at %s precedes slot start %s", xld.WALStart, start)
			}
			return
		}
	}
}

// TestNATSJetStream publishes into a JetStream stream and checks the ack and the stored message.
func TestNATSJetStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TESTENV", Subjects: []string{"testenv.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), "TESTENV") }() // a second run (-count) starts empty
	ack, err := js.Publish(ctx, "testenv.hello", []byte("world"), jetstream.WithMsgID("m1"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != "TESTENV" || ack.Sequence != 1 || ack.Duplicate {
		t.Fatalf("ack = %+v, want stream TESTENV seq 1", ack)
	}
	dup, err := js.Publish(ctx, "testenv.hello", []byte("world"), jetstream.WithMsgID("m1"))
	if err != nil || !dup.Duplicate {
		t.Fatalf("republish with the same id: ack %+v err %v, want a duplicate", dup, err)
	}
	got, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "world" || got.Subject != "testenv.hello" {
		t.Fatalf("stored %q on %q", got.Data, got.Subject)
	}
}

func TestRedisSetGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts, err := redis.ParseURL(env.Redis.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Set(ctx, "larder:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, "larder:k").Result()
	if err != nil || v != "v" {
		t.Fatalf("GET = %q, %v; want v", v, err)
	}
	if v, err := c.ConfigGet(ctx, "save").Result(); err != nil || v["save"] != "" {
		t.Fatalf("save = %q, %v; want persistence off", v["save"], err)
	}
}

// TestPerTestServers starts and stops a private server of each kind.
func TestPerTestServers(t *testing.T) {
	ctx := context.Background()
	pg := testenv.Postgres(t)
	u := testenv.Database(t, pg)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	conn.Close(ctx)
	if pg.Port() == env.PG.Port() {
		t.Fatal("per-test server shares the package server's port")
	}
	n := testenv.NATS(t)
	if n.URL() == env.NATS.URL() {
		t.Fatal("per-test NATS shares the package server's URL")
	}
	r := testenv.Redis(t)
	if r.Addr() == env.Redis.Addr() {
		t.Fatal("per-test Redis shares the package server's address")
	}
}

// TestMissingBinaryFailsWithHint checks that a missing server binary is an
// error carrying the install command, not a skip.
func TestMissingBinaryFailsWithHint(t *testing.T) {
	cfg := servers.DefaultPostgresConfig(filepath.Join(t.TempDir(), "pg"))
	cfg.BinDir = filepath.Join(t.TempDir(), "no-such-bin")
	_, err := servers.StartPostgres(context.Background(), cfg)
	if !servers.IsMissingBinary(err) || !strings.Contains(err.Error(), "apt-get install postgresql-15") {
		t.Fatalf("err = %v; want a MissingBinaryError with the install hint", err)
	}
	rc := servers.DefaultRedisConfig(t.TempDir())
	rc.Bin = filepath.Join(t.TempDir(), "redis-server")
	_, err = servers.StartRedis(context.Background(), rc)
	var mb *servers.MissingBinaryError
	if !errors.As(err, &mb) || mb.Name != "redis-server" || !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Fatalf("err = %v; want a MissingBinaryError for redis-server with the install hint", err)
	}
	nc := servers.DefaultNATSConfig(t.TempDir())
	nc.Bin = "larder-no-such-nats-server"
	_, err = servers.StartNATS(context.Background(), nc)
	if !servers.IsMissingBinary(err) || !strings.Contains(err.Error(), "go install github.com/nats-io/nats-server/v2@") {
		t.Fatalf("err = %v; want a MissingBinaryError with the go install hint", err)
	}
}

// TestPostgresDataSurvivesRestart is what the local stack relies on.
func TestPostgresDataSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := servers.DefaultPostgresConfig(filepath.Join(dir, "pg"))
	for round := 0; round < 2; round++ {
		pg, err := servers.StartPostgres(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			_, err = conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
		} else {
			var v string
			err = conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v)
			if err == nil && v != "still here" {
				t.Errorf("after restart kept = %q", v)
			}
		}
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := pg.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
