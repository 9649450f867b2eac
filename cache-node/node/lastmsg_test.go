package node

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// jetStreamFor is a JetStream context on a connection of the test's own,
// made with opts.
func jetStreamFor(t *testing.T, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(env.NATS.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// lastMessages finds each subject's last message, or none, the same way
// whether the stream allows direct gets (many subjects a request, in
// chunks) or not (one request a subject), and when the batch answer comes
// too late: then it asks one subject at a time rather than take the
// silence for "no message" (which would reopen the subscription race).
func TestLastMessages(t *testing.T) {
	js := jetStreamFor(t)
	ctx := context.Background()
	const subjects = lastMultiMax + 200 // two chunks
	for _, c := range []struct {
		direct bool
		wait   time.Duration // lastMultiTimeout
	}{{true, 5 * time.Second}, {false, 5 * time.Second}, {true, time.Microsecond}} {
		direct := c.direct
		defer func(old time.Duration) { lastMultiTimeout = old }(lastMultiTimeout)
		lastMultiTimeout = c.wait // a tiny one: the answer comes too late
		name := fmt.Sprintf("LASTMSG_%v_%d", direct, seq.Add(1))
		prefix := fmt.Sprintf("lastmsg%d", seq.Add(1))
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage, AllowDirect: direct})
		if err != nil {
			t.Fatal(err)
		}
		var batch []*group
		want := map[string]string{}
		for i := 0; i < subjects; i++ {
			subj := fmt.Sprintf("%s.s%d", prefix, i)
			batch = append(batch, &group{subject: subj})
			if i%3 == 0 {
				continue // no message
			}
			for k := 0; k <= i%4; k++ {
				body := fmt.Sprintf("%d-%d", i, k)
				if _, err := js.Publish(ctx, subj, []byte(body)); err != nil {
					t.Fatal(err)
				}
				want[subj] = body
			}
		}
		batch = append(batch, batch[1]) // a subject twice
		stream, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{js: js}
		got, err := n.lastMessages(ctx, stream, batch)
		if err != nil {
			// Refusing is right; answering with subjects missing is not.
			t.Logf("direct=%v, wait %s: %v", direct, c.wait, err)
			continue
		}
		if len(got) != len(want) {
			t.Errorf("direct=%v: %d subjects found, want %d", direct, len(got), len(want))
		}
		for subj, body := range want {
			if m := got[subj]; m == nil || string(m.Data) != body {
				t.Errorf("direct=%v: %s: %v, want %q", direct, subj, m, body)
			}
		}
	}
}

// The floor follows the stream's first message: cached while it is the
// same message, read again once older messages are gone or the stream
// was made anew (its sequence numbers start over).
func TestFloorCache(t *testing.T) {
	js := jetStreamFor(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("floor%d", seq.Add(1))
	name := invalidation.StreamName(prefix)
	cfg := jetstream.StreamConfig{Name: name, Subjects: invalidation.StreamSubjects(prefix), Storage: jetstream.MemoryStorage}
	heartbeat := func(lsn uint64) {
		if _, err := js.Publish(ctx, invalidation.HeartbeatSubject(prefix), invalidation.AppendHeartbeat(nil, invalidation.Heartbeat{LSN: lsn, Time: time.Now()})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	heartbeat(100)
	heartbeat(200)
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var fc floorCache
	want := func(step string, lsn uint64) {
		t.Helper()
		if got, err := fc.of(ctx, stream); err != nil || got != lsn {
			t.Fatalf("%s: floor %d, %v; want %d", step, got, err, lsn)
		}
	}
	want("first", 100)
	heartbeat(300)
	want("a newer message does not move it", 100)
	if err := stream.Purge(ctx, jetstream.WithPurgeKeep(1)); err != nil {
		t.Fatal(err)
	}
	want("older messages gone", 300)
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	heartbeat(400)
	want("the stream made anew", 400)
	// Made anew again: its first sequence number is 1 as before, but
	// the message is another.
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // a creation time of its own
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	heartbeat(500)
	want("the stream made anew, same first sequence", 500)
}

// An invalidator that restarts with a new tag column set publishes that
// set's tags only from its new session on. A subject without messages
// then proves nothing about the time before the session's epoch: a
// result computed before a change the old session published under other
// tags must not be served past that change, nor a newer result before
// the epoch.
func TestEpochBoundsCompleteness(t *testing.T) {
	for _, withEpoch := range []bool{true, false} {
		t.Run(fmt.Sprintf("epoch=%v", withEpoch), func(t *testing.T) {
			h := newHarness(t)
			s := h.f.now()
			// The old session: seller 7's item changes, published under
			// the only set it had, items(id).
			c := h.f.commit(invalidation.Change{Tag: "public.items(id)=9", Columns: []string{"seller"}})
			epoch := c + 5
			if withEpoch {
				b := invalidation.AppendTxn(nil, &invalidation.Txn{CommitLSN: epoch, EndLSN: epoch, CommitTime: time.Now(),
					Changes: []invalidation.Change{{Tag: "epoch"}}})
				if _, err := h.f.js.Publish(context.Background(), invalidation.EpochSubject(h.f.prefix), b); err != nil {
					t.Fatal(err)
				}
			}
			l := h.f.commit(invalidation.Change{Tag: "public.other", Rows: true})
			h.waitWatermark(l)
			bySeller := store.Dep{Tag: "public.items(seller)=7", Table: "public.items", Reads: []string{"seller"}}
			h.put("before", s, bySeller) // computed before the change
			h.put("after", l, bySeller)  // computed after it
			h.served("before", s)
			stale := 0
			if r := h.lookup("before", c, l); r.Miss == store.Hit {
				stale++ // served after the change it does not reflect
			}
			if r := h.lookup("after", s, c-1); r.Miss == store.Hit {
				stale++ // served before the change it reflects
			}
			if withEpoch && stale > 0 {
				t.Fatalf("%d stale answers with the epoch", stale)
			}
			if !withEpoch && stale == 0 {
				t.Fatal("without an epoch the subscription check trusted the empty subject, yet nothing was stale: the test cannot fail")
			}
		})
	}
}

// With SyncQueueLen, a confirmation's direct get does not make a
// subscription channel of the connection's default 64 Ki messages
// (512 KiB) each time: an application with an L1 confirms groups all the
// time, and those channels were half of what it allocated.
func TestLastMessagesAllocateLittle(t *testing.T) {
	js := jetStreamFor(t, SyncQueueLen())
	ctx := context.Background()
	name, prefix := fmt.Sprintf("LASTALLOC_%d", seq.Add(1)), fmt.Sprintf("lastalloc%d", seq.Add(1))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	var batch []*group
	for i := range 4 {
		subj := fmt.Sprintf("%s.s%d", prefix, i)
		batch = append(batch, &group{subject: subj})
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{js: js}
	const runs = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if got, err := n.lastMessages(ctx, stream, batch); err != nil || len(got) != len(batch) {
			t.Fatalf("%d of %d subjects, %v", len(got), len(batch), err)
		}
	}
	runtime.ReadMemStats(&after)
	// The default channel alone is 512 KiB a request.
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 128<<10 {
		t.Fatalf("%d KiB allocated a confirmation of %d subjects", per>>10, len(batch))
	}
}
