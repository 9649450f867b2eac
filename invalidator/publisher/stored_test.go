package publisher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
)

// A session that ends after its messages were stored but before a
// heartbeat covered them (so before its slot was confirmed past them)
// leaves them to the next session, which decodes them again. The next
// session finds them in the stream and does not publish them again,
// though they carry no message id; the commits after its start go out
// without one. A next session with one more tag column set publishes
// that set's messages of those commits: only what is stored is skipped.
// When the scan finds only part of what is stored (a message missing in
// the middle), every subject's last message is still its last change:
// what follows a republished message on its subject is republished too.
func TestResumeSkipsWhatTheStreamHolds(t *testing.T) {
	t.Run("same sets", func(t *testing.T) { resumeSkipsStored(t, false, false) })
	t.Run("one more set", func(t *testing.T) { resumeSkipsStored(t, true, false) })
	t.Run("a message missing", func(t *testing.T) { resumeSkipsStored(t, false, true) })
}

func resumeSkipsStored(t *testing.T, moreSets, missing bool) {
	h := newHarness(t, "CREATE TABLE rs (id int PRIMARY KEY, v int); ALTER TABLE rs REPLICA IDENTITY FULL")
	// The first session publishes on a connection of its own, closed to
	// end it: nothing it holds back can reach the stream afterwards.
	nc1, err := nats.Connect(h.nc.ConnectedUrl(), nats.ReconnectBufSize(-1), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc1.Close)
	cfg := h.config()
	cfg.NATS = nc1
	cfg.Heartbeat = time.Hour // only the heartbeats writes ask for
	cfg.TagColumns = map[string][][]string{"public.rs": {{"id"}}}
	h.start(cfg)

	// Every heartbeat from now on waits until the session has lost NATS.
	release := make(chan struct{})
	hook := func() { <-release }
	beforeHeartbeatForTest.Store(&hook)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(func() { releaseOnce(); beforeHeartbeatForTest.Store(nil) })

	const writes = 5
	commits := map[uint64]bool{}
	var last uint64
	for i := 1; i <= writes; i++ {
		last = uint64(h.exec(fmt.Sprintf("INSERT INTO rs VALUES (%d, %d)", i, i)))
	}
	timeout := time.After(30 * time.Second)
	for len(commits) < writes {
		select {
		case m := <-h.msgs:
			if m.Heartbeat != nil {
				t.Fatalf("a heartbeat through %X came while heartbeats were held", m.Heartbeat.LSN)
			}
			commits[m.Txn.CommitLSN] = true
		case <-timeout:
			t.Fatalf("the writes' invalidations did not come: %d of %d", len(commits), writes)
		}
	}
	confirmedBefore := h.slotConfirmed()
	nc1.Close()
	releaseOnce()
	_ = h.stop() // an error (NATS lost), or none if the stop came first
	beforeHeartbeatForTest.Store(nil)
	if c := h.slotConfirmed(); uint64(c) >= last-1 {
		t.Fatalf("the slot was confirmed at %s, past the writes (through %X; %s before): nothing to decode again", c, last, confirmedBefore)
	}
	js, err := jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.Stream(ctx, invalidation.StreamName(h.prefix))
	if err != nil {
		t.Fatal(err)
	}
	lost := storedKey{}
	if missing {
		// The second write's message on the table's tag (the subject
		// every write has a message on) goes: the scan stops at the gap,
		// finding the later writes' messages but not the first's.
		second := slices.Sorted(maps.Keys(commits))[1]
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		table := invalidation.TagSubject(h.prefix, "public.rs")
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && lost.lsn == 0; seq++ {
			raw, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			if m, err := invalidation.Decode(raw.Data); err == nil && m.Txn != nil && m.Txn.CommitLSN == second && raw.Subject == table {
				if err := stream.DeleteMsg(ctx, seq); err != nil {
					t.Fatal(err)
				}
				lost = storedKey{second, raw.Subject}
			}
		}
		if lost.lsn == 0 {
			t.Fatalf("no message of commit %X on the table's subject %s", second, table)
		}
	}

	reg := prometheus.NewRegistry()
	cfg2 := h.config()
	cfg2.Metrics = reg
	cfg2.TagColumns = cfg.TagColumns
	if moreSets {
		cfg2.TagColumns = map[string][][]string{"public.rs": {{"id"}, {"v"}}}
	}
	s2 := h.startPublisher(cfg2)
	h.collectThrough(h.walLSN()) // the second session is under way
	after := h.exec("INSERT INTO rs VALUES (100, 100)")
	h.collectThrough(after)
	if err := s2.stop(); err != nil {
		t.Fatalf("second session: %v", err)
	}

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	copies := map[storedKey]int{}
	// By subject, among the writes decoded twice: the last message's
	// commit, and the largest.
	lastOn, maxOn := map[string]uint64{}, map[string]uint64{}
	subjects := map[uint64]int{} // of each write decoded twice
	newCommit := uint64(0)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		raw, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // the one deleted
		}
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		if raw.Subject == invalidation.EpochSubject(h.prefix) || raw.Subject == invalidation.HeartbeatSubject(h.prefix) {
			continue
		}
		m, err := invalidation.Decode(raw.Data)
		if err != nil || m.Txn == nil {
			t.Fatalf("message %d on %s: %v", seq, raw.Subject, err)
		}
		k := storedKey{m.Txn.CommitLSN, raw.Subject}
		if commits[k.lsn] {
			lastOn[k.subject], maxOn[k.subject] = k.lsn, max(maxOn[k.subject], k.lsn)
		}
		if copies[k]++; copies[k] == 1 && commits[k.lsn] {
			subjects[k.lsn]++
		}
		if m.Txn.CommitLSN > last {
			newCommit = m.Txn.CommitLSN
			if id := raw.Header.Get(jetstream.MsgIDHeader); id != "" {
				t.Errorf("message %d, of a commit after the second session started, carries the id %q", seq, id)
			}
		}
	}
	for k, n := range copies {
		if n != 1 && !missing {
			t.Errorf("commit %X is stored %d times on %s", k.lsn, n, k.subject)
		}
	}
	for subject, lsn := range lastOn {
		if lsn != maxOn[subject] {
			t.Errorf("the last message on %s is of commit %X, after one of %X: a cache-node reading it would miss the later change", subject, lsn, maxOn[subject])
		}
	}
	if missing && copies[lost] != 1 {
		t.Errorf("the deleted message of commit %X on %s is stored %d times after the second session", lost.lsn, lost.subject, copies[lost])
	}
	if newCommit == 0 {
		t.Error("the write after the second session started is not in the stream")
	}
	want := 2 // the table tag, the id tag
	if moreSets {
		want = 3 // and the new set's tag, published by the second session
	}
	for lsn := range commits {
		if subjects[lsn] != want {
			t.Errorf("commit %X is stored on %d subjects; want %d", lsn, subjects[lsn], want)
		}
	}
	skipped := counterValue(t, reg, "larder_invalidator_stored_messages_skipped_total")
	if missing && skipped < 1 {
		t.Errorf("the second session skipped no message; it found the later writes' messages")
	} else if !missing && skipped < writes {
		t.Errorf("the second session skipped %.0f messages; the %d writes it decoded again were stored", skipped, writes)
	}
	t.Logf("slot confirmed at %s; second session skipped %.0f stored messages; %d (commit, subject) messages in the stream", confirmedBefore, skipped, len(copies))
}

// skip, commits in order: a found message is skipped while its subject
// has had nothing published; once it has, the subject's later found
// messages go out again too (its last message stays its last change).
// Past the last found commit, nothing is skipped.
func TestStoredTailSkip(t *testing.T) {
	tail := storedTail{
		stored:  map[storedKey]bool{{150, "p.inv.a"}: true, {250, "p.inv.a"}: true, {150, "p.inv.c"}: true, {250, "p.inv.c"}: true, {260, "p.inv.d"}: true},
		through: 260,
		sent:    map[string]bool{},
	}
	for _, c := range []struct {
		lsn     uint64
		subject string
		skip    bool
	}{
		{100, "p.inv.a", false}, // not found: published, and a's later messages too
		{150, "p.inv.a", false},
		{150, "p.inv.b", false},
		{150, "p.inv.c", true}, // found, nothing published on c
		{250, "p.inv.a", false},
		{250, "p.inv.c", true},
		{255, "p.inv.c", false}, // not found
		{260, "p.inv.d", true},
		{270, "p.inv.d", false}, // past the last found commit
	} {
		if skip := tail.skip(c.lsn, c.subject); skip != c.skip {
			t.Errorf("%X on %s: skip %v; want %v", c.lsn, c.subject, skip, c.skip)
		}
	}
	if tail.stored != nil || tail.sent != nil {
		t.Error("what was found is kept past the last found commit")
	}
	var none storedTail
	if none.skip(1, "p.inv.a") {
		t.Error("nothing found, yet a message is skipped")
	}
}

// The scan reads back the previous session's messages only. Before them
// the stream need not be in commit order on a subject: here session A
// stored its commit at 200 on s (its message at 100 refused), session B,
// resuming below 100, found 200, published 100 and ended before
// publishing 200 again. Session C, resuming where B did, must not count
// A's 200 as stored: skipping it would leave B's 100 as s's last message,
// and a cache-node confirming s would never learn of 200. C's own epoch,
// at B's position, may be stored or dropped as B's (the same id).
func TestScanStoredReadsThePreviousSessionOnly(t *testing.T) {
	h := newHarness(t, "")
	p, err := New(h.config())
	if err != nil {
		t.Fatal(err)
	}
	if p.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.ensureStream(ctx); err != nil {
		t.Fatal(err)
	}
	s := invalidation.TagSubject(h.prefix, "public.t(id)=1")
	other := invalidation.TagSubject(h.prefix, "public.t(id)=2")
	txn := func(lsn uint64, tag string) []byte {
		return invalidation.AppendTxn(nil, &invalidation.Txn{CommitLSN: lsn, EndLSN: lsn + 1, XID: uint32(lsn), CommitTime: time.Now(),
			Changes: []invalidation.Change{{Tag: tag}}})
	}
	epoch := func(lsn uint64) []byte {
		return invalidation.AppendTxn(nil, &invalidation.Txn{CommitLSN: lsn, EndLSN: lsn, CommitTime: time.Now(), Changes: []invalidation.Change{{Tag: "epoch"}}})
	}
	for _, m := range []struct {
		subject string
		data    []byte
	}{
		{invalidation.EpochSubject(h.prefix), epoch(50)}, // A
		{s, txn(200, "public.t(id)=1")},
		{invalidation.EpochSubject(h.prefix), epoch(90)}, // B
		{s, txn(100, "public.t(id)=1")},
		{other, txn(150, "public.t(id)=2")},
	} {
		if _, err := p.js.Publish(ctx, m.subject, m.data); err != nil {
			t.Fatal(err)
		}
	}
	// C's epoch at B's position is B's to JetStream (the same id): the
	// scan must stop at B's either way.
	for _, ownEpoch := range []bool{false, true} {
		if ownEpoch {
			if _, err := p.js.Publish(ctx, invalidation.EpochSubject(h.prefix), epoch(90)); err != nil {
				t.Fatal(err)
			}
		}
		tail, err := p.scanStored(ctx, 90, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			lsn     uint64
			subject string
			skip    bool
		}{
			{100, s, true},     // B's, found
			{150, other, true}, // B's, found
			{200, s, false},    // A's only: published again, after B's 100
		} {
			if skip := tail.skip(c.lsn, c.subject); skip != c.skip {
				t.Errorf("C's epoch stored %v: commit %d on %s: skip %v; want %v (found %v)", ownEpoch, c.lsn, c.subject, skip, c.skip, tail.stored)
			}
		}
	}
}
