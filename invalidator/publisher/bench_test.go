package publisher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
)

// pgRecvlogical is PostgreSQL's own logical decoding client, the baseline
// the publisher's decoding throughput is measured against.
const pgRecvlogical = "/usr/lib/postgresql/15/bin/pg_recvlogical"

// benchDDL is a table of single-row transactions with two tag column sets,
// and a procedure that commits n of them (half INSERTs, a quarter UPDATEs
// of a non-key column, a quarter UPDATEs that move a row to another group).
const benchDDL = `
CREATE TABLE bench (id int PRIMARY KEY, grp int NOT NULL, owner int NOT NULL, v int NOT NULL DEFAULT 0, note text);
ALTER TABLE bench REPLICA IDENTITY FULL;
CREATE PROCEDURE bench_load(n int) LANGUAGE plpgsql AS $$
DECLARE k int := 0;
BEGIN
  FOR i IN 1..n LOOP
    IF i % 2 = 1 THEN
      k := k + 1;
      INSERT INTO bench (id, grp, owner, note) VALUES (k, k % 97, k % 13, 'row ' || k);
    ELSIF i % 4 = 0 THEN
      UPDATE bench SET v = v + 1 WHERE id = 1 + (i::bigint * 7919) % k;
    ELSE
      UPDATE bench SET grp = (grp + 1) % 97 WHERE id = 1 + (i::bigint * 104729) % k;
    END IF;
    COMMIT;
  END LOOP;
END $$;
`

func benchSets() map[string][][]string {
	return map[string][][]string{"public.bench": {{"id"}, {"grp"}}}
}

// decodeWorkload is a database whose WAL holds a finished workload, and a
// logical slot (pgoutput) created before it: each measured drain copies
// the slot, so every drain decodes the same WAL from the same start.
type decodeWorkload struct {
	url      string
	conn     *pgx.Conn
	template string // the slot copied by every drain
	pub      string // the publication
	end      pglogrepl.LSN
	rows     int
	seq      int
}

func newDecodeWorkload(b *testing.B, txns int) *decodeWorkload {
	b.Helper()
	ctx := context.Background()
	n := seq.Add(1)
	w := &decodeWorkload{url: testenv.Database(b, env.PG), template: fmt.Sprintf("bench_template_%d", n), pub: "bench_pub", rows: txns}
	var err error
	if w.conn, err = pgx.Connect(ctx, w.url); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.conn.Close(context.Background()) })
	for _, sql := range []string{
		benchDDL,
		"CREATE PUBLICATION bench_pub FOR ALL TABLES",
		"SELECT pg_create_logical_replication_slot('" + w.template + "', 'pgoutput')",
	} {
		if _, err := w.conn.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	began := time.Now()
	if _, err := w.conn.Exec(ctx, "CALL bench_load($1)", txns); err != nil {
		b.Fatal(err)
	}
	w.end = lsnOf(b, w.conn, "SELECT pg_current_wal_lsn()::text")
	// A record past the end, so that pg_recvlogical sees the end go by.
	if _, err := w.conn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'bench.end', '')"); err != nil {
		b.Fatal(err)
	}
	b.Logf("workload: %d single-row transactions in %s, WAL end %s", txns, time.Since(began).Round(time.Millisecond), w.end)
	return w
}

func lsnOf(tb testing.TB, conn *pgx.Conn, query string, args ...any) pglogrepl.LSN {
	tb.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), query, args...).Scan(&s); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// copySlot makes a new slot at the template's position with plugin.
func (w *decodeWorkload) copySlot(b *testing.B, plugin string) string {
	b.Helper()
	w.seq++
	name := fmt.Sprintf("%s_%s_%d", w.template, plugin, w.seq)
	if _, err := w.conn.Exec(context.Background(), "SELECT pg_copy_logical_replication_slot($1, $2, false, $3)", w.template, name, plugin); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.dropSlot(b, name) })
	return name
}

func (w *decodeWorkload) dropSlot(b *testing.B, name string) {
	ctx := context.Background()
	for range 100 { // a walsender that just ended releases its slot asynchronously
		_, err := w.conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", name)
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Errorf("slot %s not dropped", name)
}

// walsenderCPU follows the walsender that serves slot and returns a
// function giving the CPU time it used, once it has exited (or as last
// seen).
func (w *decodeWorkload) walsenderCPU(b *testing.B, slot string) (wait func() time.Duration) {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), w.url)
	if err != nil {
		b.Fatal(err)
	}
	var used atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		var pid int
		for pid == 0 {
			var p *int
			if err := conn.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&p); err != nil {
				return
			}
			if p != nil {
				pid = *p
			} else {
				time.Sleep(5 * time.Millisecond)
			}
		}
		for {
			t, ok := procCPU(pid)
			if !ok {
				return
			}
			used.Store(int64(t))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() time.Duration {
		<-done
		return time.Duration(used.Load())
	}
}

// procCPU reads a process's user and system time from /proc.
func procCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 || fields[0] == "Z" {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const ticks = 100 // USER_HZ
	return time.Duration(ut+st) * time.Second / ticks, true
}

// selfCPU is this process's user and system time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drain is one measured drain: its wall time, the CPU time of the
// consumer (pg_recvlogical, or this process: publisher, embedded NATS,
// acknowledgements) and of the walsender that decoded for it.
type drain struct {
	wall, consumer, walsender time.Duration
}

func (d *drain) add(o drain) {
	d.wall += o.wall
	d.consumer += o.consumer
	d.walsender += o.walsender
}

// report reports the drains' rows/s and CPU time per row, and returns
// both (the CPU time of the consumer and the walsender together).
func (d drain) report(b *testing.B, rows int) (rate, cpuPerRow float64) {
	rate = float64(rows) / d.wall.Seconds()
	b.ReportMetric(rate, "rows/s")
	b.ReportMetric(float64(d.consumer.Microseconds())/float64(rows), "consumer-cpu-us/row")
	b.ReportMetric(float64(d.walsender.Microseconds())/float64(rows), "walsender-cpu-us/row")
	return rate, float64((d.consumer + d.walsender).Microseconds()) / float64(rows)
}

// recvlogical drains a test_decoding copy of the slot with pg_recvlogical
// up to the workload's end.
func (w *decodeWorkload) recvlogical(b *testing.B) drain {
	b.Helper()
	b.StopTimer()
	slot := w.copySlot(b, "test_decoding")
	cmd := exec.Command(pgRecvlogical, "-d", w.url, "-S", slot, "--start", "--no-loop", "-E", w.end.String(), "-f", "/dev/null")
	cmd.Stderr = os.Stderr
	walsender := w.walsenderCPU(b, slot)
	b.StartTimer()
	began := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	took := time.Since(began)
	b.StopTimer()
	confirmed := lsnOf(b, w.conn, "SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1", slot)
	if confirmed < w.end {
		b.Fatalf("pg_recvlogical stopped at %s, before the end %s", confirmed, w.end)
	}
	return drain{wall: took, consumer: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), walsender: walsender()}
}

// publish drains a copy of the slot with a publisher until it publishes a
// heartbeat past the workload's end: every transaction before it was
// decoded, published and acknowledged by JetStream.
func (w *decodeWorkload) publish(b *testing.B, memory bool) drain {
	b.Helper()
	b.StopTimer()
	slot := w.copySlot(b, "pgoutput")
	nc, err := nats.Connect(env.NATS.URL(), nats.ReconnectBufSize(-1))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	prefix := "b" + strconv.Itoa(int(seq.Add(1)))
	reached := make(chan struct{})
	var once sync.Once
	sub, err := nc.Subscribe(invalidation.HeartbeatSubject(prefix), func(m *nats.Msg) {
		d, err := invalidation.Decode(m.Data)
		if err == nil && d.Heartbeat != nil && d.Heartbeat.LSN >= uint64(w.end) {
			once.Do(func() { close(reached) })
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := New(Config{
		ConnString:    w.url,
		Slot:          slot,
		Publication:   w.pub,
		TagColumns:    benchSets(),
		NATS:          nc,
		SubjectPrefix: prefix,
		Heartbeat:     10 * time.Millisecond,
		StreamMemory:  memory,
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics:       reg,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	walsender := w.walsenderCPU(b, slot)
	runtime.GC()
	b.StartTimer()
	cpu0 := selfCPU()
	began := time.Now()
	go func() { done <- p.Run(ctx) }()
	select {
	case <-reached:
	case err := <-done:
		cancel()
		b.Fatalf("publisher stopped: %v", err)
	case <-time.After(5 * time.Minute):
		cancel()
		b.Fatal("the publisher did not reach the end within 5 minutes")
	}
	took := time.Since(began)
	cpu := selfCPU() - cpu0
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if rows := counterValue(b, reg, "larder_invalidator_row_changes_total"); int(rows) != w.rows {
		b.Fatalf("the publisher decoded %.0f row changes; the workload made %d", rows, w.rows)
	}
	msgs := counterValue(b, reg, "larder_invalidator_messages_total")
	b.ReportMetric(msgs/float64(w.rows), "msgs/row")
	if js, err := nc.JetStream(); err == nil {
		_ = js.DeleteStream(invalidation.StreamName(prefix))
	}
	return drain{wall: took, consumer: cpu, walsender: walsender()}
}

// recvlogicalRate and recvlogicalCPU are the rows/s and the CPU time per
// row of the pg_recvlogical sub-benchmark, for the publisher
// sub-benchmarks' ratios.
var recvlogicalRate, recvlogicalCPU float64

// BenchmarkDecodeVsPgRecvlogical compares the publisher draining its slot
// (decode, tag, publish to JetStream, wait for the acknowledgements) with
// pg_recvlogical draining a test_decoding slot to /dev/null, both from the
// same start over the same WAL. x-recvlogical is the ratio of rows/s;
// x-recvlogical-cpu the inverse ratio of CPU time per row (consumer and
// walsender), which a machine busy with other work disturbs less.
func BenchmarkDecodeVsPgRecvlogical(b *testing.B) {
	const txns = 20000
	if _, err := os.Stat(pgRecvlogical); err != nil {
		b.Fatalf("pg_recvlogical: %v (apt-get install postgresql-15)", err)
	}
	w := newDecodeWorkload(b, txns)
	b.Logf("GOMAXPROCS %d, %d CPUs usable", runtime.GOMAXPROCS(0), runtime.NumCPU())
	b.Run("pg_recvlogical", func(b *testing.B) {
		var total drain
		for range b.N {
			total.add(w.recvlogical(b))
		}
		recvlogicalRate, recvlogicalCPU = total.report(b, txns*b.N)
	})
	for _, storage := range []string{"memory", "file"} {
		b.Run("publisher_"+storage, func(b *testing.B) {
			var total drain
			for range b.N {
				total.add(w.publish(b, storage == "memory"))
			}
			rate, cpu := total.report(b, txns*b.N)
			if recvlogicalRate > 0 && cpu > 0 {
				b.ReportMetric(rate/recvlogicalRate, "x-recvlogical")
				b.ReportMetric(recvlogicalCPU/cpu, "x-recvlogical-cpu")
			}
		})
	}
}

// BenchmarkCommitToSubscriberLatency paces writers at about 5000
// single-row commits a second for 5 seconds, and measures, for every
// commit, the time from the writer's COMMIT returning to a core NATS
// subscriber of the invalidation subjects receiving the row's keyed tag.
func BenchmarkCommitToSubscriberLatency(b *testing.B) {
	const (
		rate     = 5000
		duration = 5 * time.Second
		writers  = 16
		perRun   = int(rate * duration / time.Second)
	)
	ctx := context.Background()
	url := testenv.Database(b, env.PG)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE lat (id bigint PRIMARY KEY, grp int NOT NULL);
ALTER TABLE lat REPLICA IDENTITY FULL;`); err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(env.NATS.URL(), nats.ReconnectBufSize(-1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close) // after the publisher stops
	n := seq.Add(1)
	prefix := fmt.Sprintf("lat%d", n)
	started := newReplicating()
	p, err := New(Config{
		ConnString:    url,
		Slot:          fmt.Sprintf("larder_lat_%d", n),
		Publication:   fmt.Sprintf("larder_lat_%d", n),
		TagColumns:    map[string][][]string{"public.lat": {{"id"}, {"grp"}}},
		NATS:          nc,
		SubjectPrefix: prefix,
		Commits:       started,
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	s := runSession(b, p)
	started.wait(b, s)

	// The subscriber: one subscription, so that heartbeats come in order
	// with the invalidations.
	total := perRun * b.N
	base := time.Now()
	received := make([]atomic.Int64, total+1) // ns since base; 0: not yet
	// From the commit record's own timestamp (PostgreSQL's clock, this
	// host's), independent of when the writer saw its COMMIT return.
	fromRecord := make([]atomic.Int64, total+1) // µs
	var lastHB atomic.Uint64
	subNC, err := nats.Connect(env.NATS.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer subNC.Close()
	const idTag = "public.lat(id)="
	sub, err := subNC.Subscribe(prefix+".>", func(m *nats.Msg) {
		now := int64(time.Since(base))
		wall := time.Now().UnixMicro()
		d, err := invalidation.Decode(m.Data)
		if err != nil {
			return
		}
		if d.Heartbeat != nil {
			lastHB.Store(d.Heartbeat.LSN)
			return
		}
		for _, c := range d.Txn.Changes {
			if id, ok := strings.CutPrefix(c.Tag, idTag); ok {
				if i, err := strconv.Atoi(id); err == nil && i > 0 && i <= total {
					if received[i].CompareAndSwap(0, now) {
						fromRecord[i].Store(wall - d.Txn.CommitTime.UnixMicro())
					}
				}
			}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	if err := subNC.Flush(); err != nil {
		b.Fatal(err)
	}

	committed := make([]int64, total+1) // ns since base, after COMMIT returned
	conns := make([]*pgx.Conn, writers)
	for i := range conns {
		if conns[i], err = pgx.Connect(ctx, url); err != nil {
			b.Fatal(err)
		}
		defer conns[i].Close(ctx)
	}
	var wrote time.Duration
	b.ResetTimer()
	for iter := range b.N {
		began := time.Now()
		var wg sync.WaitGroup
		for wi := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				interval := time.Duration(writers) * time.Second / rate
				start := began.Add(time.Duration(wi) * interval / writers)
				for k := 0; ; k++ {
					id := iter*perRun + k*writers + wi + 1
					if id > (iter+1)*perRun {
						return
					}
					if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
						time.Sleep(d)
					}
					if _, err := conns[wi].Exec(ctx, "INSERT INTO lat (id, grp) VALUES ($1, $2)", id, id%50); err != nil {
						b.Error(err)
						return
					}
					committed[id] = int64(time.Since(base))
				}
			}()
		}
		wg.Wait()
		wrote += time.Since(began)
	}
	b.StopTimer()
	if b.Failed() {
		b.FailNow()
	}
	end := lsnOf(b, conn, "SELECT pg_current_wal_lsn()::text")
	deadline := time.Now().Add(60 * time.Second)
	for lastHB.Load() < uint64(end) {
		if time.Now().After(deadline) {
			b.Fatalf("no heartbeat past %s within a minute", end)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lat := make([]float64, 0, total)
	rec := make([]float64, 0, total)
	missing := 0
	for id := 1; id <= total; id++ {
		r := received[id].Load()
		if r == 0 {
			missing++
			continue
		}
		lat = append(lat, float64(r-committed[id])/1e6)
		rec = append(rec, float64(fromRecord[id].Load())/1e3)
	}
	if missing > 0 {
		b.Errorf("%d of %d commits never reached the subscriber", missing, total)
	}
	if err := s.stop(); err != nil {
		b.Errorf("publisher: %v", err)
	}
	if len(lat) == 0 {
		b.FailNow()
	}
	slices.Sort(lat)
	slices.Sort(rec)
	q := func(l []float64, f float64) float64 { return l[min(len(l)-1, int(f*float64(len(l))))] }
	b.ReportMetric(float64(total)/wrote.Seconds(), "commits/s")
	b.ReportMetric(q(lat, 0.50), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(q(rec, 0.50), "p50-ms-from-record")
	b.ReportMetric(q(rec, 0.99), "p99-ms-from-record")
	for _, l := range []struct {
		name string
		v    []float64
	}{{"from COMMIT returned", lat}, {"from the commit record's timestamp", rec}} {
		b.Logf("%s: min %.2f ms, p50 %.2f, p90 %.2f, p99 %.2f, p99.9 %.2f, max %.2f",
			l.name, l.v[0], q(l.v, 0.5), q(l.v, 0.9), q(l.v, 0.99), q(l.v, 0.999), l.v[len(l.v)-1])
	}
	b.Logf("%d commits in %s by %d writers (GOMAXPROCS %d)", total, wrote.Round(time.Millisecond), writers, runtime.GOMAXPROCS(0))
}
