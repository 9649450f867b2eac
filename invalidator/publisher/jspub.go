package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
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
	msg    nats.Msg
	msgID  []string    // the Nats-Msg-Id header's value
	header nats.Header // holding msgID: the header of a message with an id
	reply  []byte

	mu   sync.Mutex
	seq  uint64 // the last sequence number used
	base uint64 // replies to sequences <= base are of spent messages: ignored
	// answered has bit seq-base-1 set once message seq was answered: a
	// second answer to one message (which JetStream does not send) must
	// not stand for another's.
	answered []uint64
	err      error  // the first refusal among them
	errSeq   uint64 // the message it answered
	// the wait under way (awaitThrough): it ends once every message in
	// (base, waitCut] is answered (waitAcked of them so far) or one of
	// them was refused.
	wake      chan struct{}
	waitCut   uint64
	waitAcked uint64
	// reconnects when the first unspent message was published: a
	// reconnection loses the acknowledgements of what was sent before it.
	reconnects uint64
}

// newAckPublisher subscribes to the replies of a new inbox on nc.
func newAckPublisher(nc *nats.Conn) (*ackPublisher, error) {
	a := &ackPublisher{nc: nc, prefix: nc.NewInbox() + ".", msgID: make([]string, 1)}
	a.header = nats.Header{jetstream.MsgIDHeader: a.msgID}
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

// publish sends data on subject with message id msgID ("": none, so
// JetStream neither looks for nor remembers one), asking for an
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
	a.msg.Header = nil
	if msgID != "" {
		a.msgID[0] = msgID
		a.msg.Header = a.header
	}
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

// outstanding is the number of messages published and not yet spent by
// a wait.
func (a *ackPublisher) outstanding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.seq - a.base)
}

// mark is the sequence number of the last message published: awaitThrough
// waits for it and every one before it.
func (a *ackPublisher) mark() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seq
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
	if err != nil && (a.err == nil || seq < a.errSeq) {
		a.err, a.errSeq = err, seq
	}
	if a.wake == nil {
		return
	}
	if seq <= a.waitCut {
		a.waitAcked++
	}
	if (a.err != nil && a.errSeq <= a.waitCut) || a.waitAcked == a.waitCut-a.base {
		close(a.wake)
		a.wake = nil
	}
}

// errAckTimeout: JetStream did not acknowledge within ackTimeout.
var errAckTimeout = errors.New("publisher: JetStream acknowledgements timed out")

// awaitAll waits until JetStream acknowledged every message published
// and not yet spent (awaitThrough of the last one).
func (a *ackPublisher) awaitAll(ctx context.Context, timeout time.Duration) error {
	return a.awaitThrough(ctx, a.mark(), timeout)
}

// awaitThrough waits until JetStream acknowledged every message published
// up to cut (a mark) and not yet spent; the first refusal among them, a
// reconnection (the replies of what was sent before it are lost), the
// timeout or ctx end the wait with an error. Whatever happened, those
// messages are then spent: a failed session resumes from the slot and
// publishes them again. Messages published after cut are not waited for
// (they may be published while it waits). One wait at a time.
func (a *ackPublisher) awaitThrough(ctx context.Context, cut uint64, timeout time.Duration) error {
	a.mu.Lock()
	if cut > a.seq {
		cut = a.seq
	}
	if cut <= a.base {
		a.mu.Unlock()
		return nil
	}
	var wake chan struct{}
	if !(a.err != nil && a.errSeq <= cut) {
		n := a.answeredThroughLocked(cut)
		if n < cut-a.base {
			wake = make(chan struct{})
			a.wake, a.waitCut, a.waitAcked = wake, cut, n
		}
	}
	reconnects := a.reconnects
	a.mu.Unlock()
	err := a.wait(ctx, wake, timeout, reconnects)
	a.mu.Lock()
	var refused error
	if a.err != nil && a.errSeq <= cut {
		refused = a.err
	}
	a.spendThroughLocked(cut)
	a.mu.Unlock()
	switch {
	case refused != nil:
		return fmt.Errorf("publisher: JetStream refused a message: %w", refused)
	case err == nil, errors.Is(err, errAckTimeout):
		return err
	}
	return fmt.Errorf("publisher: waiting for JetStream's acknowledgements: %w", err)
}

// answeredThroughLocked counts the messages in (base, cut] answered.
func (a *ackPublisher) answeredThroughLocked(cut uint64) uint64 {
	n, width := uint64(0), cut-a.base
	for w := uint64(0); w*64 < width && w < uint64(len(a.answered)); w++ {
		word := a.answered[w]
		if rest := width - w*64; rest < 64 {
			word &= 1<<rest - 1
		}
		n += uint64(bits.OnesCount64(word))
	}
	return n
}

// reset forgets the messages published so far (a new session).
func (a *ackPublisher) reset() {
	a.mu.Lock()
	a.spendThroughLocked(a.seq)
	a.mu.Unlock()
}

// spendThroughLocked forgets the messages up to cut: their late replies
// are ignored, and a refusal among them no longer counts.
func (a *ackPublisher) spendThroughLocked(cut uint64) {
	a.wake = nil
	if cut >= a.seq {
		a.base, a.err, a.errSeq = a.seq, nil, 0
		clear(a.answered)
		a.answered = a.answered[:0]
		return
	}
	n := cut - a.base
	a.answered = shiftBits(a.answered, n)
	a.base = cut
	if a.err != nil && a.errSeq <= cut {
		a.err, a.errSeq = nil, 0
	}
}

// shiftBits drops the first n bits of words (bit i of the result is bit
// i+n of words) and returns the words left, reusing words.
func shiftBits(words []uint64, n uint64) []uint64 {
	skip, off := int(n/64), n%64
	if skip >= len(words) {
		clear(words)
		return words[:0]
	}
	k := copy(words, words[skip:])
	clear(words[k:])
	words = words[:k]
	if off == 0 {
		return words
	}
	for i := range words {
		words[i] >>= off
		if i+1 < len(words) {
			words[i] |= words[i+1] << (64 - off)
		}
	}
	return words
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
