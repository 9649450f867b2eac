package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ackPublisher publishes messages to JetStream without waiting for each
// acknowledgement, and waits for all of them at once (awaitAll).
//
// It does what jetstream.PublishMsgAsync does for this one use, at a
// fraction of its cost per message: no future, map entry or timer per
// message, a reused message and header, acknowledgements counted rather
// than matched, and an acknowledgement's JSON read only when it reports
// an error. Every message still asks JetStream for its acknowledgement
// (a reply subject of its own), so awaitAll returns nil only once
// JetStream has stored (or de-duplicated) every message published since
// the last awaitAll.
type ackPublisher struct {
	nc     *nats.Conn
	sub    *nats.Subscription
	prefix string // reply subjects are prefix + a decimal sequence number

	// reused for every message: nats.Conn.PublishMsg copies what it sends
	msg   nats.Msg
	msgID []string // the Nats-Msg-Id header's value
	reply []byte

	mu    sync.Mutex
	seq   uint64 // the last sequence number used
	base  uint64 // replies to sequences <= base are of spent batches: ignored
	acked uint64 // replies received to sequences > base
	// answered has bit seq-base-1 set once message seq was answered: a
	// second answer to one message (which JetStream does not send) must
	// not stand for another's.
	answered []uint64
	err      error // the first refusal among them
	wake     chan struct{}
	// reconnects when the batch's first message was published: a
	// reconnection loses the acknowledgements of what was sent before it.
	reconnects uint64
}

// newAckPublisher subscribes to the replies of a new inbox on nc.
func newAckPublisher(nc *nats.Conn) (*ackPublisher, error) {
	a := &ackPublisher{nc: nc, prefix: nc.NewInbox() + ".", msgID: make([]string, 1)}
	a.msg.Header = nats.Header{jetstream.MsgIDHeader: a.msgID}
	sub, err := nc.Subscribe(a.prefix+"*", a.onReply)
	if err != nil {
		return nil, fmt.Errorf("publisher: subscribe to JetStream's acknowledgements: %w", err)
	}
	// The outstanding messages bound the replies: never drop one.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("publisher: subscribe to JetStream's acknowledgements: %w", err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("publisher: subscribe to JetStream's acknowledgements: %w", err)
	}
	a.sub = sub
	return a, nil
}

// publish sends data on subject with message id msgID, asking for an
// acknowledgement.
func (a *ackPublisher) publish(subject, msgID string, data []byte) error {
	a.mu.Lock()
	if a.seq == a.base {
		a.reconnects = a.nc.Stats().Reconnects
	}
	a.seq++
	seq := a.seq
	a.mu.Unlock()
	a.reply = strconv.AppendUint(append(a.reply[:0], a.prefix...), seq, 10)
	a.msgID[0] = msgID
	a.msg.Subject, a.msg.Reply, a.msg.Data = subject, string(a.reply), data
	err := a.nc.PublishMsg(&a.msg)
	a.msg.Data = nil
	if err != nil {
		// Count it as answered (by this error), so that awaitAll does not
		// wait for a reply that cannot come.
		a.note(seq, err)
	}
	return err
}

// outstanding is the number of messages published since the last
// awaitAll.
func (a *ackPublisher) outstanding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.seq - a.base)
}

// onReply receives JetStream's acknowledgements.
func (a *ackPublisher) onReply(m *nats.Msg) {
	seq, err := strconv.ParseUint(m.Subject[len(a.prefix):], 10, 64)
	if err != nil {
		return
	}
	a.note(seq, replyError(m))
}

// replyError is the error a reply to a published message reports: nil
// for a PubAck (also of a duplicate).
func replyError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		// A status: 503 when no stream takes the subject.
		status, descr := m.Header.Get("Status"), m.Header.Get("Description")
		if status == "503" {
			return fmt.Errorf("%w (no stream answered)", jetstream.ErrNoStreamResponse)
		}
		return fmt.Errorf("no acknowledgement: status %q %q", status, descr)
	}
	if !bytes.Contains(m.Data, []byte(`"error"`)) {
		if bytes.Contains(m.Data, []byte(`"stream"`)) {
			return nil
		}
		return fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, m.Data)
	}
	var r struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, m.Data)
	}
	if r.Error != nil {
		return r.Error
	}
	if r.Stream == "" {
		return fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, m.Data)
	}
	return nil
}

// note counts the answer to message seq.
func (a *ackPublisher) note(seq uint64, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq <= a.base || seq > a.seq {
		return
	}
	i := seq - a.base - 1
	for uint64(len(a.answered)) <= i/64 {
		a.answered = append(a.answered, 0)
	}
	if a.answered[i/64]&(1<<(i%64)) != 0 {
		return
	}
	a.answered[i/64] |= 1 << (i % 64)
	a.acked++
	if err != nil && a.err == nil {
		a.err = err
	}
	if a.wake != nil && (a.err != nil || a.acked == a.seq-a.base) {
		close(a.wake)
		a.wake = nil
	}
}

// errAckTimeout: JetStream did not acknowledge within ackTimeout.
var errAckTimeout = errors.New("publisher: JetStream acknowledgements timed out")

// awaitAll waits until JetStream acknowledged every message published
// since the last call; the first refusal, a reconnection (the replies of
// what was sent before it are lost), the timeout or ctx end the wait with
// an error. Whatever happened, those messages are then spent: a failed
// session resumes from the slot and publishes them again.
func (a *ackPublisher) awaitAll(ctx context.Context, timeout time.Duration) error {
	a.mu.Lock()
	n := a.seq - a.base
	if n == 0 {
		a.mu.Unlock()
		return nil
	}
	var wake chan struct{}
	if a.err == nil && a.acked < n {
		wake = make(chan struct{})
		a.wake = wake
	}
	reconnects := a.reconnects
	a.mu.Unlock()
	err := a.wait(ctx, wake, timeout, reconnects)
	a.mu.Lock()
	refused := a.err
	a.spendLocked()
	a.mu.Unlock()
	switch {
	case refused != nil:
		return fmt.Errorf("publisher: JetStream refused a message: %w", refused)
	case err == nil, errors.Is(err, errAckTimeout):
		return err
	}
	return fmt.Errorf("publisher: waiting for JetStream's acknowledgements: %w", err)
}

// reset forgets the messages published so far (a new session).
func (a *ackPublisher) reset() {
	a.mu.Lock()
	a.spendLocked()
	a.mu.Unlock()
}

func (a *ackPublisher) spendLocked() {
	a.base, a.acked, a.err, a.wake = a.seq, 0, nil, nil
	clear(a.answered)
	a.answered = a.answered[:0]
}

func (a *ackPublisher) wait(ctx context.Context, wake chan struct{}, timeout time.Duration, reconnects uint64) error {
	if wake == nil {
		return nil
	}
	select { // the common case: every acknowledgement is already in
	case <-wake:
		return nil
	default:
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-wake:
			return nil
		case <-poll.C:
			if !a.nc.IsConnected() || a.nc.Stats().Reconnects != reconnects {
				return nats.ErrDisconnected
			}
		case <-deadline.C:
			return errAckTimeout
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
