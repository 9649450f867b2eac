package publisher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/internal/testenv"
)

// ordDDL is the table the concurrent writers share: every writer inserts,
// updates and deletes its own rows, so no two transactions wait on one
// another's row locks, while the grp groups are shared by all writers.
const ordDDL = `
CREATE TABLE ord (id bigint PRIMARY KEY, grp int NOT NULL, v int NOT NULL DEFAULT 0, writer int NOT NULL);
ALTER TABLE ord REPLICA IDENTITY FULL;
`

const ordTable = "public.ord"

func ordSets() map[string][][]string {
	return map[string][][]string{ordTable: {{"id"}, {"grp"}}}
}

// committedTxn is a transaction a writer saw commit, with the subjects its
// invalidations must travel on.
type committedTxn struct {
	xid      uint32 // low 32 bits of txid_current()
	xid64    int64
	writer   int
	n        int
	subjects map[string]bool
}

// workload is what a burst of concurrent writers did.
type workload struct {
	mu        sync.Mutex
	committed []committedTxn
	aborted   map[uint32]bool
	done      atomic.Int64 // transactions finished (committed or rolled back)
}

// ordRow is a row a writer owns.
type ordRow struct {
	id  int64
	grp int
}

// runWriters runs writers goroutines of perWriter short read/write
// transactions each on the ord table and returns when all have finished.
// after, when set, is called after every finished transaction with the
// number finished so far.
func runWriters(t *testing.T, url, prefix string, writers, perWriter int, after func(done int64)) *workload {
	t.Helper()
	w := &workload{aborted: map[uint32]bool{}}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.writer(url, prefix, i, perWriter, after); err != nil {
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	return w
}

func (w *workload) writer(url, prefix string, id, count int, after func(int64)) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rng := rand.New(rand.NewPCG(uint64(id)+1, 42))
	var rows []ordRow
	next := int64(id) * 1_000_000
	const groups = 40

	table := invalidation.TagSubject(prefix, tags.TableTag(ordTable).String())
	idSubj := func(v int64) string {
		return invalidation.TagSubject(prefix, tags.Tag{Table: ordTable, Columns: []string{"id"}, Values: []string{strconv.FormatInt(v, 10)}}.String())
	}
	grpSubj := func(g int) string {
		return invalidation.TagSubject(prefix, tags.Tag{Table: ordTable, Columns: []string{"grp"}, Values: []string{strconv.Itoa(g)}}.String())
	}

	for n := range count {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		var xid int64
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
			return err
		}
		subjects := map[string]bool{table: true}
		newRows := rows
		insert := func() error {
			next++
			r := ordRow{id: next, grp: rng.IntN(groups)}
			if _, err := tx.Exec(ctx, "INSERT INTO ord (id, grp, writer) VALUES ($1, $2, $3)", r.id, r.grp, id); err != nil {
				return err
			}
			subjects[idSubj(r.id)], subjects[grpSubj(r.grp)] = true, true
			newRows = append(newRows[:len(newRows):len(newRows)], r)
			return nil
		}
		pick := func() int { return rng.IntN(len(rows)) }
		op := rng.Float64()
		rollback := false
		switch {
		case len(rows) < 3 || op < 0.30:
			err = insert()
		case op < 0.55: // a non-key column: every tag keeps its row
			r := rows[pick()]
			var grp int
			if err = tx.QueryRow(ctx, "SELECT grp FROM ord WHERE id = $1", r.id).Scan(&grp); err == nil && grp != r.grp {
				err = fmt.Errorf("row %d: grp %d, want %d", r.id, grp, r.grp)
			}
			if err == nil {
				_, err = tx.Exec(ctx, "UPDATE ord SET v = v + 1 WHERE id = $1", r.id)
				subjects[idSubj(r.id)], subjects[grpSubj(r.grp)] = true, true
			}
		case op < 0.75: // a key column: the old and the new group
			i := pick()
			r := rows[i]
			g := (r.grp + 1 + rng.IntN(groups-1)) % groups
			if _, err = tx.Exec(ctx, "UPDATE ord SET grp = $2 WHERE id = $1", r.id, g); err == nil {
				subjects[idSubj(r.id)], subjects[grpSubj(r.grp)], subjects[grpSubj(g)] = true, true, true
				newRows = append([]ordRow(nil), rows...)
				newRows[i].grp = g
			}
		case op < 0.85:
			i := pick()
			r := rows[i]
			if _, err = tx.Exec(ctx, "DELETE FROM ord WHERE id = $1", r.id); err == nil {
				subjects[idSubj(r.id)], subjects[grpSubj(r.grp)] = true, true
				newRows = append(append([]ordRow(nil), rows[:i]...), rows[i+1:]...)
			}
		case op < 0.95: // two rows in one transaction
			i := pick()
			r := rows[i]
			if _, err = tx.Exec(ctx, "UPDATE ord SET v = v + 10 WHERE id = $1", r.id); err == nil {
				subjects[idSubj(r.id)], subjects[grpSubj(r.grp)] = true, true
				err = insert()
			}
		default: // written, then rolled back: must never be published
			err = insert()
			rollback = true
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if rollback {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			w.mu.Lock()
			w.aborted[uint32(xid)] = true
			w.mu.Unlock()
		} else {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			rows = newRows
			w.mu.Lock()
			w.committed = append(w.committed, committedTxn{xid: uint32(xid), xid64: xid, writer: id, n: n, subjects: subjects})
			w.mu.Unlock()
		}
		d := w.done.Add(1)
		if after != nil {
			after(d)
		}
	}
	return nil
}

// streamStats summarises a verified stream.
type streamStats struct {
	txnMsgs, heartbeats int
	duplicates          int // (xid, subject) pairs stored more than once, counting the extra copies
	txns                int // distinct transactions
	interleaved         int // heartbeats before the last transaction message
	slotFlushMsgs       int // messages of the flushes of new slots
}

// verifyStream checks a stream read from its start:
//
//   - transaction messages come in non-decreasing commit LSN order;
//   - heartbeats never go backwards;
//   - no transaction message arrives after a heartbeat at or past its
//     commit LSN (a heartbeat promises every such transaction came before);
//   - every message carries the changes of one subject, and the messages of
//     one xid share one commit LSN;
//   - every committed transaction is present on every subject it touched and
//     on no other (exactly once when exact, else at least once); no rolled
//     back transaction and no unknown one is present.
func verifyStream(t *testing.T, prefix string, msgs []invalidation.Message, w *workload, exact bool) streamStats {
	t.Helper()
	var st streamStats
	const maxReports = 10
	reports := map[string]int{}
	report := func(kind, format string, args ...any) {
		t.Helper()
		reports[kind]++
		if reports[kind] <= maxReports {
			t.Errorf(kind+": "+format, args...)
		}
	}
	var lastCommit, lastHB uint64
	type key struct {
		xid     uint32
		subject string
	}
	seen := map[key]int{}
	lsnOf := map[uint32]uint64{}
	heartbeatsSoFar := 0
	for i, m := range msgs {
		if hb := m.Heartbeat; hb != nil {
			st.heartbeats++
			heartbeatsSoFar++
			if hb.LSN < lastHB {
				report("heartbeat backwards", "message %d: heartbeat %X after heartbeat %X", i, hb.LSN, lastHB)
			}
			lastHB = max(lastHB, hb.LSN)
			continue
		}
		tx := m.Txn
		st.txnMsgs++
		st.interleaved = heartbeatsSoFar
		if tx.CommitLSN < lastCommit {
			report("commit order", "message %d: xid %d at %X after a transaction at %X", i, tx.XID, tx.CommitLSN, lastCommit)
		}
		lastCommit = max(lastCommit, tx.CommitLSN)
		if tx.CommitLSN <= lastHB {
			report("after heartbeat", "message %d: xid %d at %X after heartbeat %X", i, tx.XID, tx.CommitLSN, lastHB)
		}
		if tx.XID == 0 {
			// A new slot's flush of every table, at its consistent point
			// (checked in slot_test.go).
			st.slotFlushMsgs++
			continue
		}
		if l, ok := lsnOf[tx.XID]; ok && l != tx.CommitLSN {
			report("xid LSN", "xid %d at %X and at %X", tx.XID, l, tx.CommitLSN)
		}
		lsnOf[tx.XID] = tx.CommitLSN
		if len(tx.Changes) == 0 {
			report("empty", "message %d: xid %d without changes", i, tx.XID)
			continue
		}
		subject := ""
		for _, c := range tx.Changes {
			s := invalidation.TagSubject(prefix, c.Tag)
			if c.Flush {
				s = invalidation.FlushSubject(prefix, c.Tag)
			}
			if subject == "" {
				subject = s
			} else if s != subject {
				report("mixed subjects", "message %d: xid %d carries changes of two subjects", i, tx.XID)
			}
		}
		seen[key{tx.XID, subject}]++
	}
	st.txns = len(lsnOf)

	committed := map[uint32]*committedTxn{}
	for i := range w.committed {
		c := &w.committed[i]
		if committed[c.xid] != nil {
			t.Fatalf("xid %d committed twice (low 32 bits of %d)", c.xid, c.xid64)
		}
		committed[c.xid] = c
		for s := range c.subjects {
			switch n := seen[key{c.xid, s}]; {
			case n == 0:
				report("missing", "xid %d (writer %d, transaction %d) not published on %s", c.xid, c.writer, c.n, s)
			case n > 1 && exact:
				report("duplicate", "xid %d published %d times on %s", c.xid, n, s)
			}
		}
	}
	for k, n := range seen {
		st.duplicates += n - 1
		c := committed[k.xid]
		switch {
		case w.aborted[k.xid]:
			report("rolled back", "xid %d rolled back but published on %s", k.xid, k.subject)
		case c == nil:
			report("unknown", "xid %d published on %s but no writer committed it", k.xid, k.subject)
		case !c.subjects[k.subject]:
			report("extra subject", "xid %d published on %s, which it did not touch", k.xid, k.subject)
		}
	}
	for kind, n := range reports {
		if n > maxReports {
			t.Errorf("%s: %d more", kind, n-maxReports)
		}
	}
	return st
}

// collectThrough reads the stream until a heartbeat at or past lsn and
// returns every message read, heartbeats included, in stream order.
func (h *harness) collectThrough(lsn pglogrepl.LSN) []invalidation.Message {
	h.t.Helper()
	var out []invalidation.Message
	timeout := time.After(60 * time.Second)
	// A reader that passed nothing on for a while is started again after
	// the last message it read: under load an ordered consumer has been
	// seen to stall (6 messages read in a minute), which says nothing of
	// the publisher. What it then reads is checked like the rest.
	stall := time.NewTicker(10 * time.Second)
	defer stall.Stop()
	read := len(out)
	for {
		select {
		case m := <-h.msgs:
			out = append(out, m)
			if m.Heartbeat != nil && m.Heartbeat.LSN >= uint64(lsn) {
				return out
			}
		case <-stall.C:
			if len(out) == read && len(h.msgs) == 0 {
				h.cc.Stop()
				h.cc = nil
				seq := h.readSeq.Load()
				h.t.Logf("stream reader passed nothing on for 10 s (%d messages read, stream sequence %d): reading again after it", len(out), seq)
				js, err := jetstream.New(h.nc)
				if err != nil {
					h.t.Fatal(err)
				}
				if err := h.consume(js, seq+1); err != nil {
					h.t.Fatalf("restart the stream reader: %v", err)
				}
			}
			read = len(out)
		case <-timeout:
			h.t.Fatalf("no heartbeat past %s within a minute (%d messages read)", lsn, len(out))
		}
	}
}

// session is one Run of a publisher.
type session struct {
	p    *Publisher
	done chan struct{}
	err  error // Run's result, once done is closed
	stop func() error
}

// runSession runs p until stop is called (or the test ends) and returns
// at once; stop returns Run's error.
func runSession(t testing.TB, p *Publisher) *session {
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{p: p, done: make(chan struct{})}
	go func() { s.err = p.Run(ctx); close(s.done) }()
	s.stop = func() error {
		cancel()
		<-s.done
		return s.err
	}
	t.Cleanup(func() { _ = s.stop() })
	return s
}

// startPublisher makes a publisher from cfg and runs it: only the
// publisher, not the harness's reader of the stream.
func (h *harness) startPublisher(cfg Config) *session {
	h.t.Helper()
	p, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return runSession(h.t, p)
}

// supervise runs publishers made from cfg one after another, a new one
// shortly after each failure (as the invalidator restarts its publisher),
// until stop is called; stop returns the failed sessions' errors.
func (h *harness) supervise(cfg Config) (stop func() []error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var errs []error
	go func() {
		defer close(done)
		for {
			p, err := New(cfg)
			if err == nil {
				err = p.Run(ctx)
			}
			if ctx.Err() != nil {
				return
			}
			h.t.Logf("publisher session failed: %v", err)
			errs = append(errs, err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	stop = func() []error {
		cancel()
		<-done
		return errs
	}
	h.t.Cleanup(func() { stop() })
	return stop
}

// readStream starts the harness's reader of the stream (into h.msgs) once
// a publisher has made the stream.
func (h *harness) readStream() {
	h.t.Helper()
	js, err := jetstream.New(h.nc)
	if err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := h.consume(js, 1)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no stream: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slotConfirmed returns the slot's confirmed flush LSN.
func (h *harness) slotConfirmed() pglogrepl.LSN {
	h.t.Helper()
	var s string
	if err := h.conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", h.slot).Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

// commitRange is a CommitRecorder remembering the first and the last
// commit a publisher decoded.
type commitRange struct {
	mu          sync.Mutex
	first, last uint64
	n           int
}

func (c *commitRange) Commit(_ uint32, lsn uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		c.first = lsn
	}
	c.last = lsn
	c.n++
}

func (c *commitRange) Through(uint64) {}

func (c *commitRange) get() (first, last uint64, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first, c.last, c.n
}

// replicating is a CommitRecorder whose channel closes at the first
// heartbeat: the publisher then decodes every transaction that begins
// afterwards.
type replicating struct {
	once sync.Once
	ch   chan struct{}
}

func newReplicating() *replicating { return &replicating{ch: make(chan struct{})} }

func (r *replicating) Commit(uint32, uint64) {}

func (r *replicating) Through(uint64) { r.once.Do(func() { close(r.ch) }) }

// wait returns once the publisher of s replicates, failing the test if s
// ends first.
func (r *replicating) wait(t testing.TB, s *session) {
	t.Helper()
	select {
	case <-r.ch:
	case <-s.done:
		t.Fatalf("publisher stopped: %v", s.err)
	case <-time.After(60 * time.Second):
		t.Fatal("no heartbeat within a minute")
	}
}

// counterValue reads a counter from a registry.
func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// milestone closes its channel once a count reaches n.
type milestone struct {
	n    int64
	once sync.Once
	ch   chan struct{}
}

func newMilestone(n int64) *milestone { return &milestone{n: n, ch: make(chan struct{})} }

func (m *milestone) note(done int64) {
	if done >= m.n {
		m.once.Do(func() { close(m.ch) })
	}
}

const (
	orderWriters   = 6
	orderPerWriter = 300
)

func TestCommitOrderUnderConcurrentWriters(t *testing.T) {
	h := newHarness(t, ordDDL)
	cfg := h.config()
	cfg.TagColumns = ordSets()
	h.start(cfg)

	begun := time.Now()
	w := runWriters(t, h.url, h.prefix, orderWriters, orderPerWriter, nil)
	wrote := time.Since(begun)
	if t.Failed() {
		t.FailNow()
	}
	msgs := h.collectThrough(h.walLSN())
	st := verifyStream(t, h.prefix, msgs, w, true)
	t.Logf("%d writers: %d transactions committed, %d rolled back in %s; stream: %d transaction messages of %d transactions, %d heartbeats (%d among the transactions)",
		orderWriters, len(w.committed), len(w.aborted), wrote.Round(time.Millisecond), st.txnMsgs, st.txns, st.heartbeats, st.interleaved)
	if st.txns != len(w.committed) {
		t.Errorf("%d transactions in the stream, %d committed", st.txns, len(w.committed))
	}
	if st.interleaved == 0 {
		t.Errorf("no heartbeat among the transactions: the heartbeat ordering was not exercised")
	}
}

// A publisher cancelled in the middle of a burst, and a new one started on
// the same slot, publication and subjects while the writers go on, publish
// every committed transaction; what the second decodes again and the
// stream holds, it does not publish again (stored.go).
func TestCrashResumeInProcess(t *testing.T) {
	h := newHarness(t, ordDDL)
	cfg := h.config()
	cfg.TagColumns = ordSets()
	reg1, rec1 := prometheus.NewRegistry(), &commitRange{}
	cfg.Metrics, cfg.Commits = reg1, rec1
	h.start(cfg)

	total := int64(orderWriters * orderPerWriter)
	third, twoThirds := newMilestone(total/3), newMilestone(2*total/3)
	var (
		wg        sync.WaitGroup
		w         *workload
		resumedAt pglogrepl.LSN
		reg2      = prometheus.NewRegistry()
		rec2      = &commitRange{}
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		w = runWriters(t, h.url, h.prefix, orderWriters, orderPerWriter, func(d int64) { third.note(d); twoThirds.note(d) })
		third.note(total) // a writer that failed must not leave the test waiting
		twoThirds.note(total)
	}()

	<-third.ch
	if err := h.stop(); err != nil {
		t.Fatalf("first publisher: %v", err)
	}
	<-twoThirds.ch
	resumedAt = h.slotConfirmed()
	cfg2 := cfg
	cfg2.Metrics, cfg2.Commits = reg2, rec2
	s2 := h.startPublisher(cfg2)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	msgs := h.collectThrough(h.walLSN())
	if err := s2.stop(); err != nil {
		t.Errorf("second publisher: %v", err)
	}
	st := verifyStream(t, h.prefix, msgs, w, false)
	if st.txns != len(w.committed) {
		t.Errorf("%d transactions in the stream, %d committed", st.txns, len(w.committed))
	}

	first1, last1, n1 := rec1.get()
	first2, last2, n2 := rec2.get()
	if n2 == 0 || first2 < uint64(resumedAt) {
		t.Errorf("second publisher decoded %d commits from %X; the slot was confirmed at %s", n2, first2, resumedAt)
	}
	// Messages of the transactions both publishers decoded: stored once
	// unless the second publisher's reading back of the stream failed.
	overlap := 0
	for _, m := range msgs {
		if m.Txn != nil && m.Txn.CommitLSN >= first2 && m.Txn.CommitLSN <= last1 {
			overlap++
		}
	}
	sent1 := counterValue(t, reg1, "larder_invalidator_messages_total")
	sent2 := counterValue(t, reg2, "larder_invalidator_messages_total")
	t.Logf("first publisher: %d commits %X..%X, %.0f messages sent; slot confirmed at %s when stopped", n1, first1, last1, sent1, resumedAt)
	t.Logf("second publisher: %d commits %X..%X, %.0f messages sent", n2, first2, last2, sent2)
	t.Logf("stream: %d transaction messages stored (%d transactions), %d heartbeats; %d messages of commits both decoded, %.0f sent in all were not stored (de-duplicated by id), %d stored twice",
		st.txnMsgs, st.txns, st.heartbeats, overlap, sent1+sent2-float64(st.txnMsgs), st.duplicates)
	t.Logf("%d transactions committed, %d rolled back", len(w.committed), len(w.aborted))
}

// A publisher whose messages JetStream refuses fails; a publisher started
// again on the same slot resumes from it and loses nothing, though the
// writers never stopped.
func TestResumeAfterJetStreamRefusal(t *testing.T) {
	t.Run("new publisher", func(t *testing.T) { resumeAfterRefusal(t, false) })
	// The invalidator's restart loop runs the same Publisher again.
	t.Run("same publisher", func(t *testing.T) { resumeAfterRefusal(t, true) })
}

// resumeAfterRefusal runs the refusal scenario. reuse: the second session
// is Run again on the first session's Publisher, as the invalidator's
// restart loop does; otherwise it runs on a new Publisher.
func resumeAfterRefusal(t *testing.T, reuse bool) {
	h := newHarness(t, ordDDL)
	cfg := h.config()
	cfg.TagColumns = ordSets()
	started := newReplicating()
	cfg.Commits = started
	p1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s1 := runSession(t, p1)
	started.wait(t, s1)
	h.readStream()

	total := int64(orderWriters * orderPerWriter)
	third, twoThirds := newMilestone(total/3), newMilestone(2*total/3)
	var (
		wg sync.WaitGroup
		w  *workload
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		w = runWriters(t, h.url, h.prefix, orderWriters, orderPerWriter, func(d int64) { third.note(d); twoThirds.note(d) })
		third.note(total)
		twoThirds.note(total)
	}()

	// Fill the stream: with DiscardNew, JetStream refuses what does not fit.
	<-third.ch
	ctx := context.Background()
	js, err := jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, invalidation.StreamName(h.prefix))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	limited := info.Config
	limited.MaxMsgs = int64(info.State.Msgs) + 25
	limited.Discard = jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, limited); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the publisher went on for a minute while JetStream refused its messages")
	}
	if s1.err == nil || !(strings.Contains(s1.err.Error(), "JetStream refused") || strings.Contains(s1.err.Error(), "publish heartbeat")) {
		t.Fatalf("first session ended with %v; want JetStream's refusal", s1.err)
	}
	var apiErr *jetstream.APIError
	t.Logf("first session: %v (JetStream API error: %v)", s1.err, errors.As(s1.err, &apiErr))
	refusedAt := h.slotConfirmed()

	// The next session's stream set-up restores the stream's limits.
	<-twoThirds.ch
	p2 := p1
	if !reuse {
		if p2, err = New(cfg); err != nil {
			t.Fatal(err)
		}
	}
	s2 := runSession(t, p2)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	msgs := h.collectThrough(h.walLSN())
	if err := s2.stop(); err != nil {
		t.Errorf("second session: %v", err)
	}
	info, err = stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Discard != jetstream.DiscardOld || info.Config.MaxMsgs > 0 {
		t.Errorf("stream limits after the restart: discard %v, max messages %d", info.Config.Discard, info.Config.MaxMsgs)
	}
	st := verifyStream(t, h.prefix, msgs, w, false)
	if st.txns != len(w.committed) {
		t.Errorf("%d transactions in the stream, %d committed", st.txns, len(w.committed))
	}
	t.Logf("slot confirmed at %s when JetStream refused; %d transactions committed, %d rolled back; stream: %d transaction messages, %d heartbeats, %d stored twice",
		refusedAt, len(w.committed), len(w.aborted), st.txnMsgs, st.heartbeats, st.duplicates)
}

// A NATS server restarted in the middle of a burst (its JetStream store
// kept) fails the publisher's outstanding publishes; a publisher started
// again on the same slot once NATS is back loses nothing, and the restarted
// server still de-duplicates what is republished.
func TestResumeAfterNATSRestart(t *testing.T) {
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ncfg := servers.DefaultNATSConfig(filepath.Join(dir, "nats"))
	ns, err := servers.StartNATS(context.Background(), ncfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	ncfg.Port = ns.Port()

	h := newHarness(t, ordDDL)
	// The publisher's connection reconnects for ever, as the invalidator's
	// does, and buffers nothing while disconnected: a message published then
	// would reach the stream after the messages lost with the connection.
	pubNC, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubNC.Close)
	cfg := h.config()
	cfg.NATS = pubNC
	cfg.TagColumns = ordSets()
	started := newReplicating()
	cfg.Commits = started
	s1 := h.startPublisher(cfg)
	started.wait(t, s1)

	total := int64(orderWriters * orderPerWriter)
	third, twoThirds := newMilestone(total/3), newMilestone(2*total/3)
	var (
		wg sync.WaitGroup
		w  *workload
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		w = runWriters(t, h.url, h.prefix, orderWriters, orderPerWriter, func(d int64) { third.note(d); twoThirds.note(d) })
		third.note(total)
		twoThirds.note(total)
	}()

	<-third.ch
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.done:
		if s1.err == nil {
			t.Fatal("the first session ended without an error")
		}
		t.Logf("first session, NATS down: %v", s1.err)
	case <-twoThirds.ch:
	}
	<-twoThirds.ch
	if ns, err = servers.StartNATS(context.Background(), ncfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	select {
	case <-s1.done:
	default:
		// Waiting on a request lost with the connection: stop it as the
		// process would be stopped.
		t.Logf("first session still waiting on NATS: stopped")
		_ = s1.stop()
	}
	stop := h.supervise(cfg)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Read the stream from its start, on the restarted server.
	if h.nc, err = nats.Connect(ns.URL(), nats.ReconnectBufSize(-1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.nc.Close)
	h.readStream()
	msgs := h.collectThrough(h.walLSN())
	failures := stop()
	st := verifyStream(t, h.prefix, msgs, w, false)
	if st.txns != len(w.committed) {
		t.Errorf("%d transactions in the stream, %d committed", st.txns, len(w.committed))
	}
	t.Logf("%d sessions failed after the restart; %d transactions committed, %d rolled back; stream: %d transaction messages, %d heartbeats, %d stored twice",
		len(failures), len(w.committed), len(w.aborted), st.txnMsgs, st.heartbeats, st.duplicates)
}
