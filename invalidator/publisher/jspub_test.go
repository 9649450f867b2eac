package publisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
)

// encode makes one message per subject, in the order of each subject's
// first change, holding that subject's changes in their order: for few
// changes (searched linearly) and many (a map).
func TestEncodeGroupsBySubject(t *testing.T) {
	p := &Publisher{cfg: Config{SubjectPrefix: "larder"}}
	for _, n := range []int{1, 5, 16, 17, 200} {
		var changes []invalidation.Change
		for i := range n {
			switch i % 3 {
			case 0:
				changes = append(changes, invalidation.Change{Tag: fmt.Sprintf("public.t(id)=%d", i), Rows: true})
			case 1:
				changes = append(changes, invalidation.Change{Tag: "public.t", Flush: true})
			default:
				changes = append(changes, invalidation.Change{Tag: fmt.Sprintf("public.t(g)=%d", i%7), Columns: []string{fmt.Sprint("c", i)}})
			}
		}
		// The expectation, the obvious way.
		var order []string
		by := map[string][]invalidation.Change{}
		for _, c := range changes {
			s := p.subject(c)
			if by[s] == nil {
				order = append(order, s)
			}
			by[s] = append(by[s], c)
		}
		txn := &invalidation.Txn{CommitLSN: 0x1234, EndLSN: 0x1300, XID: 77, CommitTime: time.UnixMicro(1_700_000_000_000_000)}
		msgs, over := p.encode(txn, changes, invalidation.MaxMessageSize)
		if len(over) != 0 || len(msgs) != len(order) {
			t.Fatalf("%d changes: %d messages, %d over; want %d messages", n, len(msgs), len(over), len(order))
		}
		for i, m := range msgs {
			if m.subject != order[i] {
				t.Fatalf("%d changes: message %d on %s; want %s", n, i, m.subject, order[i])
			}
			d, err := invalidation.Decode(p.enc.data[m.start:m.end])
			if err != nil {
				t.Fatal(err)
			}
			if d.Txn == nil || d.Txn.CommitLSN != txn.CommitLSN || d.Txn.XID != txn.XID || !d.Txn.CommitTime.Equal(txn.CommitTime) {
				t.Fatalf("%d changes: message %d decodes as %+v", n, i, d)
			}
			want := by[m.subject]
			if !slices.EqualFunc(d.Txn.Changes, want, func(a, b invalidation.Change) bool {
				return a.Tag == b.Tag && a.Flush == b.Flush && a.Rows == b.Rows && a.AllColumns == b.AllColumns && slices.Equal(a.Columns, b.Columns)
			}) {
				t.Fatalf("%d changes: message %d holds %+v; want %+v", n, i, d.Txn.Changes, want)
			}
		}
		if txn.Changes != nil {
			t.Fatal("encode left changes in the transaction")
		}
	}
}

func TestEncodeReportsOversizedSubjects(t *testing.T) {
	p := &Publisher{cfg: Config{SubjectPrefix: "larder"}}
	changes := []invalidation.Change{
		{Tag: "public.t(v)=" + strings.Repeat("x", 500), Rows: true},
		{Tag: "public.t", Rows: true},
	}
	txn := &invalidation.Txn{CommitLSN: 1}
	msgs, over := p.encode(txn, changes, 200)
	if len(msgs) != 1 || msgs[0].subject != p.subject(changes[1]) {
		t.Fatalf("messages %+v; want only the table tag's", msgs)
	}
	if n, ok := over[p.subject(changes[0])]; !ok || n <= 500 || len(over) != 1 {
		t.Fatalf("over %v", over)
	}
}

func TestReplyError(t *testing.T) {
	status := func(code, descr string) *nats.Msg {
		return &nats.Msg{Header: nats.Header{"Status": {code}, "Description": {descr}}}
	}
	cases := []struct {
		name string
		msg  *nats.Msg
		ok   bool
		is   error
	}{
		{"stored", &nats.Msg{Data: []byte(`{"stream":"LARDER_INVALIDATIONS","seq":12}`)}, true, nil},
		{"duplicate", &nats.Msg{Data: []byte(`{"stream":"LARDER_INVALIDATIONS","seq":12,"duplicate":true}`)}, true, nil},
		{"refused", &nats.Msg{Data: []byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`)}, false, nil},
		{"no stream", status("503", ""), false, jetstream.ErrNoStreamResponse},
		{"other status", status("408", "Request Timeout"), false, nil},
		{"not JSON", &nats.Msg{Data: []byte(`+OK`)}, false, jetstream.ErrInvalidJSAck},
		{"an error that is not", &nats.Msg{Data: []byte(`{"error":null}`)}, false, jetstream.ErrInvalidJSAck},
	}
	for _, c := range cases {
		err := replyError(c.msg)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: %v; want %v", c.name, err, c.is)
		}
	}
	var apiErr *jetstream.APIError
	if err := replyError(cases[2].msg); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Errorf("a refusal is %#v; want a *jetstream.APIError", err)
	}
}

// ackPublisher waits for every acknowledgement of a batch, reports a
// refusal, and ignores the late replies of a batch already spent.
func TestAckPublisher(t *testing.T) {
	nc, err := nats.Connect(env.NATS.URL(), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	prefix := fmt.Sprintf("ack%d", seq.Add(1))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := invalidation.StreamName(prefix)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: invalidation.StreamSubjects(prefix), Storage: jetstream.MemoryStorage, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(ctx, name) }()
	a, err := newAckPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.sub.Unsubscribe() }()

	if err := a.awaitAll(ctx, time.Second); err != nil {
		t.Fatalf("nothing published: %v", err)
	}
	subject := invalidation.TagSubject(prefix, "public.t")
	for i := range 1000 {
		if err := a.publish(subject, fmt.Sprint("id-", i%500), []byte{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.outstanding(); n != 1000 {
		t.Fatalf("%d outstanding; want 1000", n)
	}
	if err := a.awaitAll(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := a.outstanding(); n != 0 {
		t.Fatalf("%d outstanding after awaitAll", n)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 500 {
		t.Fatalf("%d messages stored; want 500 (the others are duplicates)", info.State.Msgs)
	}

	// A subject no stream takes: JetStream's no-responders status.
	if err := a.publish(prefix+".elsewhere", "x", []byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := a.awaitAll(ctx, 10*time.Second); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish to no stream: %v", err)
	}

	// A stream that refuses: the batch fails, and the next one is judged
	// on its own.
	cfg := info.Config
	cfg.MaxMsgs, cfg.Discard = 500, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := a.publish(subject, fmt.Sprint("new-", i), []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	var apiErr *jetstream.APIError
	if err := a.awaitAll(ctx, 10*time.Second); !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "JetStream refused") {
		t.Fatalf("publish to a full stream: %v", err)
	}
	if err := a.publish(subject, "id-1", []byte{1}); err != nil { // a duplicate is acknowledged
		t.Fatal(err)
	}
	if err := a.awaitAll(ctx, 10*time.Second); err != nil {
		t.Fatalf("after a refused batch: %v", err)
	}

	// The replies of a batch given up (reset) do not count for the next.
	for i := range 100 {
		if err := a.publish(subject, fmt.Sprint("id-", i), []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	a.reset()
	if err := a.awaitAll(ctx, time.Second); err != nil {
		t.Fatalf("nothing published since the reset: %v", err)
	}
}

// A second answer to one message does not stand for another's: the
// heartbeat waits for every message's own acknowledgement.
func TestAckPublisherCountsEachMessageOnce(t *testing.T) {
	a := &ackPublisher{seq: 2}
	wake := make(chan struct{})
	a.wake, a.waitCut = wake, 2
	a.note(1, nil)
	a.note(1, nil)
	select {
	case <-wake:
		t.Fatal("two answers to message 1 counted as the whole batch")
	default:
	}
	a.note(2, nil)
	select {
	case <-wake:
	default:
		t.Fatal("every message answered, but the wait goes on")
	}
	a.reset()
	if acked := a.answeredThroughLocked(a.seq); acked != 0 || len(a.answered) != 0 {
		t.Fatalf("after spending: %d acked, %d words", acked, len(a.answered))
	}
}

// A wait through a mark spends only the messages up to it: those
// published after it stay outstanding, their refusal counts for the next
// wait, and a refusal before the mark fails this one (the heartbeater's
// waits).
func TestAckPublisherAwaitThrough(t *testing.T) {
	ctx := context.Background()
	a := &ackPublisher{seq: 200}
	for seq := uint64(1); seq <= 130; seq++ {
		a.note(seq, nil)
	}
	refused := errors.New("refused")
	a.note(150, refused)
	if err := a.awaitThrough(ctx, 130, time.Second); err != nil {
		t.Fatalf("every message through 130 answered: %v", err)
	}
	if acked := a.answeredThroughLocked(a.seq); a.base != 130 || a.outstanding() != 70 || acked != 1 {
		t.Fatalf("after the wait through 130: base %d, %d outstanding, %d acked; want 130, 70, 1", a.base, a.outstanding(), acked)
	}
	// The answer to 150 moved with the window: 131..149 are still owed.
	for seq := uint64(131); seq <= 149; seq++ {
		a.note(seq, nil)
	}
	a.note(150, nil) // a second answer is ignored
	if err := a.awaitThrough(ctx, 140, time.Second); err != nil {
		t.Fatalf("through 140: %v", err)
	}
	if err := a.awaitThrough(ctx, 160, 50*time.Millisecond); !errors.Is(err, refused) {
		t.Fatalf("through 160, 150 refused: %v", err)
	}
	if a.err != nil || a.base != 160 {
		t.Fatalf("the refusal outlived its wait (base %d, err %v)", a.base, a.err)
	}
	// 161..200 unanswered: the wait times out, and a late answer wakes
	// a wait that began before it.
	done := make(chan error, 1)
	go func() { done <- a.awaitThrough(ctx, 170, 10*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	for seq := uint64(161); seq <= 170; seq++ {
		a.note(seq, nil)
	}
	if err := <-done; err != nil {
		t.Fatalf("through 170, answered while waiting: %v", err)
	}
	if err := a.awaitThrough(ctx, 200, 50*time.Millisecond); !errors.Is(err, errAckTimeout) {
		t.Fatalf("through 200, unanswered: %v", err)
	}
}

func TestShiftBits(t *testing.T) {
	for _, n := range []uint64{0, 1, 63, 64, 65, 127, 128, 129, 200} {
		words := []uint64{0x0123456789abcdef, 0xfedcba9876543210, 0x0f0f0f0f0f0f0f0f}
		bit := func(w []uint64, i uint64) bool { return i/64 < uint64(len(w)) && w[i/64]&(1<<(i%64)) != 0 }
		orig := append([]uint64(nil), words...)
		got := shiftBits(words, n)
		for i := uint64(0); i < 192; i++ {
			if bit(got, i) != bit(orig, i+n) {
				t.Fatalf("shift by %d: bit %d is %v; want %v", n, i, bit(got, i), bit(orig, i+n))
			}
		}
	}
}
