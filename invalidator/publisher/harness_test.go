package publisher

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
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

var seq atomic.Int64

// harness is one database with its own slot, publication and subjects, a
// publisher on it, and a reader of the JetStream stream from its start.
type harness struct {
	t      *testing.T
	url    string
	conn   *pgx.Conn
	nc     *nats.Conn
	prefix string
	slot   string

	msgs   chan invalidation.Message
	epochs chan []byte // the sessions' epoch messages
	stop   func() error
	cc     jetstream.ConsumeContext
	// readSeq is the stream sequence of the last message the reader
	// passed on (collectThrough restarts a stalled reader after it).
	readSeq atomic.Uint64
}

func newHarness(t *testing.T, ddl string) *harness {
	t.Helper()
	n := seq.Add(1)
	h := &harness{t: t, url: testenv.Database(t, env.PG), prefix: fmt.Sprintf("t%d", n), slot: fmt.Sprintf("larder_test_%d", n)}
	ctx := context.Background()
	var err error
	if h.conn, err = pgx.Connect(ctx, h.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close(context.Background()) })
	if ddl != "" {
		if _, err := h.conn.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	if h.nc, err = nats.Connect(env.NATS.URL(), nats.ReconnectBufSize(-1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.nc.Close)
	h.msgs = make(chan invalidation.Message, 1<<16)
	h.epochs = make(chan []byte, 1<<10)
	return h
}

func (h *harness) config() Config {
	return Config{
		ConnString:    h.url,
		Slot:          h.slot,
		Publication:   h.slot,
		NATS:          h.nc,
		Heartbeat:     20 * time.Millisecond,
		SubjectPrefix: h.prefix,
		StreamMemory:  false,
		Log:           slog.New(slog.NewTextHandler(testWriter{h.t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// start runs a publisher until the returned stop is called; stop returns
// Run's error.
func (h *harness) start(cfg Config) {
	h.t.Helper()
	p, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = p.Run(ctx); close(done) }()
	h.stop = func() error {
		cancel()
		<-done
		return runErr
	}
	h.t.Cleanup(func() { _ = h.stop() })
	// Read the stream from its start once the publisher made it.
	js, err := jetstream.New(h.nc)
	if err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for h.cc == nil {
		select {
		case <-done:
			h.t.Fatalf("publisher stopped: %v", runErr)
		default:
		}
		if err := h.consume(js, 1); err == nil {
			break
		} else if time.Now().After(deadline) {
			h.t.Fatalf("no stream: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Replicating once a heartbeat went through. Before it come only the
	// new slot's flushes of every table (checked in slot_test.go).
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m := <-h.msgs:
			if m.Heartbeat != nil {
				// The session's epoch is in the stream before its first
				// heartbeat (cache-nodes rely on it), at a position the
				// heartbeat covers.
				select {
				case b := <-h.epochs:
					e, err := invalidation.Decode(b)
					if err != nil || e.Txn == nil || e.Txn.CommitLSN > m.Heartbeat.LSN {
						h.t.Fatalf("epoch %+v (%v) before the heartbeat at %X", e.Txn, err, m.Heartbeat.LSN)
					}
				default:
					h.t.Fatal("a heartbeat came before the session's epoch")
				}
				return
			}
		case <-done:
			h.t.Fatalf("publisher stopped: %v", runErr)
		case <-timeout:
			h.t.Fatal("no heartbeat within a minute")
		}
	}
}

// exec runs statements in one transaction and returns the WAL position
// after its commit.
func (h *harness) exec(stmts ...string) pglogrepl.LSN {
	h.t.Helper()
	ctx := context.Background()
	tx, err := h.conn.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			h.t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		h.t.Fatal(err)
	}
	return h.walLSN()
}

func (h *harness) walLSN() pglogrepl.LSN {
	h.t.Helper()
	var s string
	if err := h.conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

// until collects transaction messages until a heartbeat covering every
// commit before lsn (a WAL position after them): one at or past lsn-1, as
// a walsender keepalive at lsn brings.
func (h *harness) until(lsn pglogrepl.LSN) []*invalidation.Txn {
	h.t.Helper()
	var out []*invalidation.Txn
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m := <-h.msgs:
			if m.Txn != nil {
				out = append(out, m.Txn)
			} else if m.Heartbeat.LSN >= uint64(lsn)-1 {
				return out
			}
		case <-timeout:
			h.t.Fatalf("no heartbeat past %s within a minute", lsn)
		}
	}
}

// step runs one transaction and returns its changes by tag ("flush:" +
// table for flushes).
func (h *harness) step(stmts ...string) map[string]invalidation.Change {
	h.t.Helper()
	txns := h.until(h.exec(stmts...))
	out := map[string]invalidation.Change{}
	var lsn uint64
	for _, t := range txns {
		if lsn != 0 && t.CommitLSN != lsn {
			h.t.Fatalf("%v: messages of two transactions (%X, %X)", stmts, lsn, t.CommitLSN)
		}
		lsn = t.CommitLSN
		for _, c := range t.Changes {
			k := c.Tag
			if c.Flush {
				k = "flush:" + c.Tag
			}
			if _, dup := out[k]; dup {
				h.t.Errorf("%v: tag %s published twice", stmts, k)
			}
			out[k] = c
		}
	}
	return out
}

// describe renders changes compactly for comparisons:
// "tag:rows", "tag:cols=a,b", "tag:all", "flush:table".
func describe(cs map[string]invalidation.Change) string { return render(cs, false) }

// describeKeys is describe with "[1,2]" after a change that carries the
// keys of its rows.
func describeKeys(cs map[string]invalidation.Change) string { return render(cs, true) }

func render(cs map[string]invalidation.Change, withKeys bool) string {
	var parts []string
	for k, c := range cs {
		switch {
		case c.Flush:
			parts = append(parts, k)
		case c.Rows:
			parts = append(parts, k+":rows")
		case c.AllColumns:
			parts = append(parts, k+":all")
		default:
			parts = append(parts, k+":cols="+strings.Join(c.Columns, ","))
		}
		if withKeys && c.Keys != nil {
			parts[len(parts)-1] += "[" + strings.Join(c.Keys, ",") + "]"
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// consume starts the harness's reader of the stream at stream sequence
// from (an ordered consumer passing transactions and heartbeats to
// h.msgs, epochs to h.epochs), replacing any earlier one.
func (h *harness) consume(js jetstream.JetStream, from uint64) error {
	c, err := js.OrderedConsumer(context.Background(), invalidation.StreamName(h.prefix),
		jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return err
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil {
			h.readSeq.Store(md.Sequence.Stream)
		}
		if m.Subject() == invalidation.EpochSubject(h.prefix) {
			h.epochs <- m.Data() // a session's epoch, not a transaction
			return
		}
		d, err := invalidation.Decode(m.Data())
		if err != nil {
			h.t.Errorf("undecodable message on %s: %v", m.Subject(), err)
			return
		}
		h.msgs <- d
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { h.t.Logf("stream reader: %v", err) }))
	if err != nil {
		h.t.Fatal(err)
	}
	if h.cc != nil {
		h.cc.Stop()
	}
	h.cc = cc
	h.t.Cleanup(cc.Stop)
	return nil
}
