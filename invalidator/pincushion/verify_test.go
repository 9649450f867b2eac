package pincushion

import (
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

type logCommit struct {
	xid uint32
	lsn uint64
}

// buildLog returns a log holding commits (in LSN order), complete through
// the given LSN.
func buildLog(retain int, through uint64, commits ...logCommit) *CommitLog {
	l := NewCommitLog(retain)
	for _, c := range commits {
		l.Commit(c.xid, c.lsn)
	}
	l.Through(through)
	return l
}

func TestVerifyHandBuilt(t *testing.T) {
	const e5 = 5 << 32 // epoch 5
	cases := []struct {
		name    string
		log     *CommitLog
		snap    Snapshot
		w       uint64
		ok      bool
		ts      uint64
		because string // substring of the reason when !ok
	}{
		{
			name: "sees everything",
			log:  buildLog(0, 400, logCommit{10, 100}, logCommit{11, 200}, logCommit{12, 300}),
			snap: Snapshot{Xmin: 13, Xmax: 13}, w: 400, ok: true, ts: 399,
		},
		{
			name: "last commit in progress",
			log:  buildLog(0, 400, logCommit{10, 100}, logCommit{11, 200}, logCommit{12, 300}),
			snap: Snapshot{Xmin: 12, Xmax: 13, Xip: []uint64{12}}, w: 400, ok: true, ts: 299,
		},
		{
			name: "last commit started after the snapshot",
			log:  buildLog(0, 400, logCommit{10, 100}, logCommit{11, 200}, logCommit{12, 300}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 400, ok: true, ts: 299,
		},
		{
			name: "commits at or past W are not the snapshot's business",
			log:  buildLog(0, 900, logCommit{10, 100}, logCommit{11, 500}, logCommit{12, 600}),
			snap: Snapshot{Xmin: 11, Xmax: 11}, w: 450, ok: true, ts: 449,
		},
		{
			name: "out of order: sees B, misses earlier A in progress",
			log:  buildLog(0, 300, logCommit{10, 100}, logCommit{11, 200}),
			snap: Snapshot{Xmin: 10, Xmax: 12, Xip: []uint64{10}}, w: 300,
			because: "xid 10 is in progress in the snapshot but committed at 0/64, before visible commit at 0/C8",
		},
		{
			name: "out of order: earlier commit's xid is at xmax",
			log:  buildLog(0, 300, logCommit{12, 100}, logCommit{11, 200}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300,
			because: "xid 12 started after the snapshot (xmax 12) but committed at 0/64",
		},
		{
			name: "out of order deep in the log",
			log: buildLog(0, 1000, logCommit{10, 100}, logCommit{20, 200}, logCommit{11, 300}, logCommit{12, 400},
				logCommit{13, 500}),
			snap: Snapshot{Xmin: 14, Xmax: 20}, w: 1000,
			because: "xid 20 started after the snapshot (xmax 20) but committed at 0/C8",
		},
		{
			name: "in-progress xid that never committed is fine",
			log:  buildLog(0, 300, logCommit{11, 100}, logCommit{12, 200}),
			snap: Snapshot{Xmin: 10, Xmax: 13, Xip: []uint64{10}}, w: 300, ok: true, ts: 299,
		},
		{
			name: "log not through W",
			log:  buildLog(0, 250, logCommit{10, 100}, logCommit{11, 200}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300,
			because: "complete through 0/FA only, not up to W 0/12C",
		},
		{
			// Every commit the snapshot sees is below W: a log complete
			// through W-1 (a walsender keepalive) is enough.
			name: "log through W-1",
			log:  buildLog(0, 299, logCommit{10, 100}, logCommit{11, 200}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300, ok: true, ts: 299,
		},
		{
			name: "log through W-2",
			log:  buildLog(0, 298, logCommit{10, 100}, logCommit{11, 200}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300,
			because: "complete through 0/12A only, not up to W 0/12C",
		},
		{
			name: "empty log",
			log:  NewCommitLog(0),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300,
			because: "received nothing",
		},
		{
			name: "log without commits",
			log:  buildLog(0, 100),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 100,
			because: "not before W",
		},
		{
			name: "log without commits below W",
			log:  buildLog(0, 500, logCommit{20, 400}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 300,
			because: "commit log starts at 0/18F, not before W 0/12C",
		},
		{
			name: "snapshot older than every logged commit",
			log:  buildLog(0, 500, logCommit{20, 100}, logCommit{21, 200}),
			snap: Snapshot{Xmin: 20, Xmax: 20}, w: 300,
			because: "no commit the snapshot sees is in the commit log",
		},
		{
			name: "W read before the snapshot",
			log:  buildLog(0, 500, logCommit{20, 100}, logCommit{21, 200}),
			snap: Snapshot{Xmin: 22, Xmax: 22}, w: 150,
			because: "W was not read after the snapshot",
		},
		{
			name: "invalid snapshot",
			log:  buildLog(0, 500, logCommit{20, 100}),
			snap: Snapshot{Xmin: 22, Xmax: 21}, w: 150,
			because: "invalid snapshot",
		},
		{
			name: "W of 0",
			log:  buildLog(0, 500, logCommit{20, 100}),
			snap: Snapshot{Xmin: 22, Xmax: 22}, w: 0,
			because: "invalid WAL insert LSN",
		},
		{
			name: "epoch wraparound: old epoch visible, new epoch in progress and after xmax",
			log: buildLog(0, 600, logCommit{0xFFFFFFF0, 100}, logCommit{1, 200}, logCommit{2, 300},
				logCommit{3, 400}),
			snap: Snapshot{Xmin: e5 + 2, Xmax: e5 + 3, Xip: []uint64{e5 + 2}}, w: 500, ok: true, ts: 299,
		},
		{
			name: "epoch wraparound: xid at xmax committed early is caught",
			log:  buildLog(0, 600, logCommit{0xFFFFFFF0, 100}, logCommit{3, 150}, logCommit{1, 200}),
			snap: Snapshot{Xmin: e5 + 3, Xmax: e5 + 3}, w: 500,
			because: "xid 21474836483 started after the snapshot",
		},
		{
			name: "epoch wraparound: in-progress xid of the previous epoch",
			log:  buildLog(0, 600, logCommit{0xFFFFFFF0, 100}, logCommit{1, 200}, logCommit{0xFFFFFFFE, 250}),
			snap: Snapshot{Xmin: e5 - 2, Xmax: e5 + 3, Xip: []uint64{e5 - 2}}, w: 500, ok: true, ts: 249,
		},
		{
			name: "epoch wraparound: in-progress xid of the previous epoch committed early",
			log:  buildLog(0, 600, logCommit{0xFFFFFFFE, 100}, logCommit{1, 200}),
			snap: Snapshot{Xmin: e5 - 2, Xmax: e5 + 3, Xip: []uint64{e5 - 2}}, w: 500,
			because: "xid 21474836478 is in progress",
		},
		{
			name: "retention: snapshot seeing only dropped commits",
			log: buildLog(2, 600, logCommit{10, 100}, logCommit{11, 200}, logCommit{12, 300},
				logCommit{13, 400}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 500,
			because: "boundary 0/C8",
		},
		{
			name: "retention: snapshot seeing a retained commit",
			log: buildLog(2, 600, logCommit{10, 100}, logCommit{11, 200}, logCommit{12, 300},
				logCommit{13, 400}),
			snap: Snapshot{Xmin: 13, Xmax: 13}, w: 500, ok: true, ts: 399,
		},
		{
			name: "retention: dropped commit at or past xmax is still caught",
			log:  buildLog(2, 600, logCommit{20, 100}, logCommit{10, 200}, logCommit{11, 300}),
			snap: Snapshot{Xmin: 12, Xmax: 12}, w: 500,
			because: "xid 20 started after the snapshot (xmax 12) but committed before 0/12C (at or below the log's boundary 0/64)",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts, ok, reason := Verify(c.log, c.snap, c.w)
			if ok != c.ok || ts != c.ts {
				t.Fatalf("Verify = (%d, %v, %q), want (%d, %v)", ts, ok, reason, c.ts, c.ok)
			}
			if ok && reason != "" {
				t.Fatalf("ok with reason %q", reason)
			}
			if !ok && !strings.Contains(reason, c.because) {
				t.Fatalf("reason %q does not contain %q", reason, c.because)
			}
		})
	}
}

// model is a tiny transaction system with PostgreSQL's snapshot rules: a
// transaction gets its xid when it starts, writes its commit record (if
// it commits), then leaves the proc array. Snapshots are built from the
// proc array; commit LSNs come from the order of commit records.
type model struct {
	base   uint64 // first full xid
	aborts []bool
	events []int // transaction numbers; a transaction's 1st event starts it, 2nd commits (or aborts), 3rd ends
	retain int
	snapAt int // snapshot taken before events[snapAt]
	wAt    int // W read before events[wAt] (wAt >= snapAt)
}

type modelCommit struct {
	xid     uint64
	lsn     uint64
	endedAt int // event index of its end
}

// run plays the events and returns the snapshot, W and the commits in LSN order.
func (m *model) run() (Snapshot, uint64, []modelCommit) {
	n := len(m.aborts)
	seen := make([]int, n)
	xid := make([]uint64, n)
	next := m.base
	var commits []modelCommit
	idx := make([]int, n) // commit index of each transaction
	var snap Snapshot
	var w uint64
	ended := make([]bool, n)
	take := func() {
		latest := m.base - 1
		for i := 0; i < n; i++ {
			if ended[i] && xid[i] > latest {
				latest = xid[i]
			}
		}
		snap = Snapshot{Xmax: latest + 1}
		snap.Xmin = snap.Xmax
		for i := 0; i < n; i++ {
			if seen[i] >= 1 && !ended[i] && xid[i] < snap.Xmax {
				snap.Xip = append(snap.Xip, xid[i])
				snap.Xmin = min(snap.Xmin, xid[i])
			}
		}
		slices.Sort(snap.Xip)
	}
	for k := 0; k <= len(m.events); k++ {
		if k == m.snapAt {
			take()
		}
		if k == m.wAt {
			w = uint64(len(commits)+1)*100 + 50
		}
		if k == len(m.events) {
			break
		}
		i := m.events[k]
		seen[i]++
		switch seen[i] {
		case 1:
			xid[i] = next
			next++
		case 2:
			if !m.aborts[i] {
				idx[i] = len(commits)
				commits = append(commits, modelCommit{xid: xid[i], lsn: uint64(len(commits)+1)*100 + 100, endedAt: -1})
			} else {
				ended[i] = true
			}
		case 3:
			ended[i] = true
			commits[idx[i]].endedAt = k
		}
	}
	return snap, w, commits
}

// truth returns what an exact verifier must say: whether the snapshot
// sees a prefix of the commit stream, its timestamp, and whether it sees
// any commit at all.
func truth(snapAt int, w uint64, commits []modelCommit) (ts uint64, exact, seesAny bool) {
	prefix := true
	for _, c := range commits {
		visible := c.endedAt >= 0 && c.endedAt < snapAt
		if visible {
			seesAny = true
			if !prefix {
				return 0, false, true
			}
			continue
		}
		if prefix {
			prefix = false
			ts = w - 1
			if c.lsn < w {
				ts = c.lsn - 1
			}
		}
	}
	if prefix {
		ts = w - 1
	}
	return ts, true, seesAny
}

// check runs one model and compares Verify with the truth.
func (m *model) check(t *testing.T) {
	t.Helper()
	snap, w, commits := m.run()
	log := NewCommitLog(m.retain)
	for _, c := range commits {
		log.Commit(uint32(c.xid), c.lsn)
	}
	log.Through(1 << 40)
	// Visibility per PostgreSQL's rule must match "ended before the snapshot".
	for _, c := range commits {
		if snap.VisibleFull(c.xid) != (c.endedAt >= 0 && c.endedAt < m.snapAt) {
			t.Fatalf("model: %+v: snapshot %s misjudges xid %d", m, snap, c.xid)
		}
		if snap.Widen(uint32(c.xid)) != c.xid {
			t.Fatalf("Widen(%d) = %d with xmax %d", uint32(c.xid), snap.Widen(uint32(c.xid)), snap.Xmax)
		}
	}
	wantTS, exact, seesAny := truth(m.snapAt, w, commits)
	ts, ok, reason := Verify(log, snap, w)
	if ok && (!exact || ts != wantTS) {
		t.Fatalf("model %+v: snapshot %s W %d, commits %+v: Verify = (%d, ok), truth (%d, exact %v)", m, snap, w, commits, ts, wantTS, exact)
	}
	dropped := max(0, len(commits)-log.Len())
	if m.retain >= len(commits) || dropped == 0 {
		if want := exact && seesAny; ok != want {
			t.Fatalf("model %+v: snapshot %s W %d, commits %+v: Verify = (%d, %v, %q), truth (%d, exact %v, sees any %v)",
				m, snap, w, commits, ts, ok, reason, wantTS, exact, seesAny)
		}
	}
}

// interleavings calls fn with every interleaving of the given event counts.
func interleavings(counts []int, fn func([]int)) {
	total := 0
	for _, c := range counts {
		total += c
	}
	left := slices.Clone(counts)
	seq := make([]int, 0, total)
	var rec func()
	rec = func() {
		if len(seq) == total {
			fn(seq)
			return
		}
		for i := range left {
			if left[i] > 0 {
				left[i]--
				seq = append(seq, i)
				rec()
				seq = seq[:len(seq)-1]
				left[i]++
			}
		}
	}
	rec()
}

// TestVerifyExhaustive checks Verify against the model for every
// interleaving of three transactions (each committing or aborting), every
// snapshot point and every later W point, across an epoch boundary.
func TestVerifyExhaustive(t *testing.T) {
	const n = 3
	cases := 0
	for abortMask := 0; abortMask < 1<<n; abortMask++ {
		aborts := make([]bool, n)
		counts := make([]int, n)
		for i := range aborts {
			aborts[i] = abortMask&(1<<i) != 0
			counts[i] = 3
			if aborts[i] {
				counts[i] = 2
			}
		}
		for _, base := range []uint64{3, 1<<32 - 1} {
			interleavings(counts, func(events []int) {
				for snapAt := 0; snapAt <= len(events); snapAt++ {
					for wAt := snapAt; wAt <= len(events); wAt++ {
						m := &model{base: base, aborts: aborts, events: events, snapAt: snapAt, wAt: wAt}
						m.check(t)
						cases++
					}
				}
			})
		}
	}
	t.Logf("%d cases", cases)
}

// TestVerifyRandom checks Verify against the model on random histories of
// more transactions, with and without retention dropping old commits.
func TestVerifyRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 30000; iter++ {
		n := 2 + rng.IntN(7)
		aborts := make([]bool, n)
		left := make([]int, n)
		for i := range aborts {
			aborts[i] = rng.IntN(5) == 0
			left[i] = 3
			if aborts[i] {
				left[i] = 2
			}
		}
		var events []int
		for {
			var live []int
			for i, c := range left {
				if c > 0 {
					live = append(live, i)
				}
			}
			if len(live) == 0 {
				break
			}
			i := live[rng.IntN(len(live))]
			left[i]--
			events = append(events, i)
		}
		snapAt := rng.IntN(len(events) + 1)
		wAt := snapAt + rng.IntN(len(events)-snapAt+1)
		retain := 0
		if rng.IntN(3) == 0 {
			retain = 1 + rng.IntN(n)
		}
		base := uint64(3 + rng.IntN(100))
		if rng.IntN(2) == 0 {
			base = uint64(1+rng.IntN(8))<<32 - uint64(rng.IntN(n+1))
		}
		m := &model{base: base, aborts: aborts, events: events, snapAt: snapAt, wAt: wAt, retain: retain}
		if retain > 0 && !m.boundaryAssumptionHolds() {
			continue // outside what Verify promises (see its comment)
		}
		m.check(t)
	}
}

// boundaryAssumptionHolds reports whether every commit the log drops is
// visible to the snapshot or started after it (xid >= xmax): the condition
// Verify relies on for commits below its boundary.
func (m *model) boundaryAssumptionHolds() bool {
	snap, _, commits := m.run()
	dropped := max(0, len(commits)-m.retain)
	for _, c := range commits[:dropped] {
		if !snap.VisibleFull(c.xid) && c.xid < snap.Xmax {
			return false
		}
	}
	return true
}

func TestCommitLog(t *testing.T) {
	l := NewCommitLog(3)
	if _, started := l.Boundary(); started {
		t.Fatal("new log claims to have started")
	}
	l.Commit(10, 100)
	l.Commit(11, 200)
	l.Commit(11, 150) // replay: ignored
	l.Commit(12, 200) // replay: ignored
	if b, _ := l.Boundary(); b != 99 {
		t.Fatalf("boundary %d, want 99", b)
	}
	if got := l.ThroughLSN(); got != 200 {
		t.Fatalf("through %d, want 200 (Commit implies Through)", got)
	}
	l.Through(250)
	l.Through(240) // regression: ignored
	if got := l.ThroughLSN(); got != 250 {
		t.Fatalf("through %d, want 250", got)
	}
	if lsn, ok := l.Lookup(11); !ok || lsn != 200 {
		t.Fatalf("Lookup(11) = %d, %v", lsn, ok)
	}
	for i := uint32(0); i < 10; i++ {
		l.Commit(20+i, 300+uint64(i)*10)
	}
	if l.Len() != 3 {
		t.Fatalf("Len %d, want 3", l.Len())
	}
	if _, ok := l.Lookup(10); ok {
		t.Fatal("dropped commit still found")
	}
	if b, _ := l.Boundary(); b != 360 {
		t.Fatalf("boundary %d, want 360", b)
	}
	var got []uint64
	l.Descend(385, 370, func(xid uint32, lsn uint64) bool { got = append(got, lsn); return true })
	if !reflect.DeepEqual(got, []uint64{380}) {
		t.Fatalf("Descend(385, 370) = %v", got)
	}
	got = nil
	l.Descend(1000, 0, func(xid uint32, lsn uint64) bool { got = append(got, lsn); return len(got) < 2 })
	if !reflect.DeepEqual(got, []uint64{390, 380}) {
		t.Fatalf("Descend(1000, 0) stopped early = %v", got)
	}

	first := NewCommitLog(0)
	first.Through(500)
	first.Commit(7, 400) // at or below the boundary: unknown territory, ignored
	if first.Len() != 0 {
		t.Fatal("commit below the boundary recorded")
	}
}

func TestWaitThrough(t *testing.T) {
	l := NewCommitLog(0)
	done := make(chan error, 1)
	go func() { done <- l.WaitThrough(context.Background(), 300) }()
	l.Through(100)
	l.Commit(5, 200)
	select {
	case err := <-done:
		t.Fatalf("WaitThrough returned %v before the log reached 300", err)
	case <-time.After(20 * time.Millisecond):
	}
	l.Commit(6, 300)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.WaitThrough(ctx, 1000); err != context.Canceled {
		t.Fatalf("WaitThrough on a cancelled context = %v", err)
	}
	if err := l.WaitThrough(ctx, 300); err != nil {
		t.Fatalf("WaitThrough of a reached LSN = %v", err)
	}
}

func TestParseSnapshot(t *testing.T) {
	good := []struct {
		in   string
		want Snapshot
	}{
		{"10:20:12,15", Snapshot{Xmin: 10, Xmax: 20, Xip: []uint64{12, 15}}},
		{"10:10:", Snapshot{Xmin: 10, Xmax: 10}},
		{"10:20:15,12", Snapshot{Xmin: 10, Xmax: 20, Xip: []uint64{12, 15}}},
		{"21474836478:21474836483:21474836478", Snapshot{Xmin: 5<<32 - 2, Xmax: 5<<32 + 3, Xip: []uint64{5<<32 - 2}}},
	}
	for _, g := range good {
		got, err := ParseSnapshot(g.in)
		if err != nil || !reflect.DeepEqual(got, g.want) {
			t.Errorf("ParseSnapshot(%q) = %+v, %v; want %+v", g.in, got, err, g.want)
		}
	}
	bad := []struct{ in, because string }{
		{"", "want xmin:xmax:xip-list"},
		{"1:2", "want xmin:xmax:xip-list"},
		{"1:2:3:4", "want xmin:xmax:xip-list"},
		{"a:2:", "xmin: \"a\" is not a decimal"},
		{":2:", "xmin: empty"},
		{"1:-2:", "xmax: \"-2\" is not a decimal"},
		{"3:2:", "xmin 3 is past xmax 2"},
		{"1:5:7", "in-progress xid 7 is outside"},
		{"1:5:0", "in-progress xid 0 is outside"},
		{"1:5:3,3", "listed twice"},
		{"1:5:,", "in-progress xid 1: empty"},
		{"1:5:2,x", "in-progress xid 2: \"x\""},
		{"18446744073709551616:1:", "out of range"},
		{" 1:2:", "not a decimal"},
	}
	for _, b := range bad {
		_, err := ParseSnapshot(b.in)
		if err == nil || !strings.Contains(err.Error(), b.because) {
			t.Errorf("ParseSnapshot(%q) error %v, want one mentioning %q", b.in, err, b.because)
		}
	}
}

func FuzzParseSnapshot(f *testing.F) {
	for _, s := range []string{"10:20:12,15", "10:10:", "1:5:3,3", "21474836478:21474836483:21474836478", "::", "1:2:,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		snap, err := ParseSnapshot(s)
		if err != nil {
			return
		}
		if err := snap.Validate(); err != nil {
			t.Fatalf("ParseSnapshot(%q) returned an invalid snapshot: %v", s, err)
		}
		again, err := ParseSnapshot(snap.String())
		if err != nil || !reflect.DeepEqual(again, snap) {
			t.Fatalf("ParseSnapshot(%q).String() = %q parses to %+v, %v", s, snap.String(), again, err)
		}
	})
}
