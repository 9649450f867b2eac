package publisher

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// commitWatch is a CommitRecorder that reports the commits decoded.
type commitWatch struct {
	mu      sync.Mutex
	last    uint64 // the highest commit LSN passed to Commit
	through uint64
}

func (c *commitWatch) Commit(_ uint32, lsn uint64) {
	c.mu.Lock()
	c.last = max(c.last, lsn)
	c.mu.Unlock()
}

func (c *commitWatch) Through(lsn uint64) {
	c.mu.Lock()
	c.through = max(c.through, lsn)
	c.mu.Unlock()
}

// lastCommit is the highest commit LSN decoded.
func (c *commitWatch) lastCommit() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

func (c *commitWatch) decoded() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.last, c.through)
}

// While a heartbeat waits for JetStream, the replication loop goes on
// decoding and publishing: later transactions reach the commit log (what
// places clients' fresh snapshots) and their invalidations go out, but no
// heartbeat covers them until the one before is published; then one does.
// Before, the loop itself waited for every heartbeat's acknowledgements
// (two JetStream round trips after each published transaction), and the
// decoding stopped meanwhile.
func TestDecodingGoesOnWhileAHeartbeatWaits(t *testing.T) {
	h := newHarness(t, "CREATE TABLE hw (id int PRIMARY KEY, v int)")
	cfg := h.config()
	cfg.Heartbeat = time.Hour // only the heartbeats writes ask for
	watch := &commitWatch{}
	cfg.Commits = watch
	h.start(cfg)

	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(held)
			<-release
		})
	}
	beforeHeartbeatForTest.Store(&hook)
	defer beforeHeartbeatForTest.Store(nil)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()

	first := h.exec("INSERT INTO hw VALUES (1, 1)")
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no heartbeat was asked for after a write")
	}
	var last uint64
	for i := 2; i <= 6; i++ {
		last = uint64(h.exec(fmt.Sprintf("INSERT INTO hw VALUES (%d, %d)", i, i)))
	}
	// last is the WAL position after the last commit: decoded through it
	// less one once a keepalive follows, or its commit at least.
	deadline := time.Now().Add(10 * time.Second)
	for watch.decoded() < last-1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := watch.decoded(); got < uint64(first) {
		t.Fatalf("while a heartbeat waited, the commits after it were not decoded: decoded through %X, the writes ended at %X", got, last)
	}
	if got := watch.decoded(); got < last-1 {
		t.Fatalf("while a heartbeat waited, decoding stopped at %X; the writes ended at %X", got, last)
	}
	// Their invalidations went out, and no heartbeat covers them yet.
	seen := map[uint64]bool{} // commits after the first
	timeout := time.After(10 * time.Second)
	for len(seen) < 5 {
		select {
		case m := <-h.msgs:
			if m.Heartbeat != nil && m.Heartbeat.LSN >= uint64(first) {
				t.Fatalf("a heartbeat through %X came while the one before it was held", m.Heartbeat.LSN)
			}
			if m.Txn != nil && m.Txn.CommitLSN >= uint64(first) {
				seen[m.Txn.CommitLSN] = true
			}
		case <-timeout:
			t.Fatalf("the invalidations of the writes after the held heartbeat did not come: %v", seen)
		}
	}
	// Let go, the held heartbeat is followed by one through the last
	// commit: the keepalive that asked for it may end before last (WAL
	// written after the commit), so the commit is what it must cover.
	lastCommit := watch.lastCommit()
	releaseOnce()
	timeout = time.After(30 * time.Second)
	for {
		select {
		case m := <-h.msgs:
			if m.Heartbeat != nil && m.Heartbeat.LSN >= lastCommit {
				return
			}
		case <-timeout:
			t.Fatalf("no heartbeat through the last commit (%X) after the held one was let go", lastCommit)
		}
	}
}
