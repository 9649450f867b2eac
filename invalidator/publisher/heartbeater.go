package publisher

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// heartbeater publishes heartbeats off the replication loop.
//
// A heartbeat through an LSN may be published only once JetStream has
// acknowledged every invalidation of the commits at or before it: a node
// that recovers from the stream must never find a heartbeat stored past
// an invalidation that was lost. Waiting for those acknowledgements, and
// then for the heartbeat's own, is two round trips to JetStream; made
// inside the replication loop, they stopped the decoding for their
// duration after every published transaction (a third of the loop's time
// under RUBiS's bidding mix), and every fresh snapshot and watermark that
// follows the decoder waited with it.
//
// So the loop only hands a heartbeat over (ask) with the mark of the last
// message it published before it, and goes on decoding and publishing.
// The heartbeater waits for the acknowledgements up to that mark (those
// published later are waited for by the next heartbeat), publishes the
// heartbeat, and then records it (the last heartbeat, the slot position
// to confirm). Requests that come while one is under way are merged: the
// next heartbeat is through the latest. A failure (a refusal, a timeout)
// ends the session, as it did when the loop waited itself: the loop sees
// it (failed) at its next message, or at once when its read is cut.
type heartbeater struct {
	mu      sync.Mutex
	cond    *sync.Cond // a heartbeat ended, or the heartbeater stopped
	req     hbRequest  // the next one (through 0: none)
	busy    bool       // a heartbeat is under way
	stopped bool
	err     error         // the first failure; the session ends on it
	asked   atomic.Uint64 // the latest heartbeat asked for
	// confirmAsked is the latest slot position asked to be confirmed.
	confirmAsked uint64
	kick         chan struct{}
	// interrupt cuts the replication loop's read short (a failure).
	interrupt func()
}

// hbRequest is a heartbeat through through, published once every message
// up to cut (ackPublisher.mark) is acknowledged, confirming confirm to the
// slot when not 0.
type hbRequest struct {
	through, cut uint64
	confirm      uint64
}

func newHeartbeater(interrupt func()) *heartbeater {
	h := &heartbeater{kick: make(chan struct{}, 1), interrupt: interrupt}
	h.cond = sync.NewCond(&h.mu)
	return h
}

// errHeartbeaterStopped: the heartbeater's session ended.
var errHeartbeaterStopped = errors.New("publisher: the heartbeater stopped")

// ask hands over a heartbeat (nothing when one through as far was asked
// for already). A request not yet started is replaced by a later one,
// which covers it.
func (h *heartbeater) ask(r hbRequest) {
	h.mu.Lock()
	if r.through <= h.asked.Load() && r.confirm <= h.confirmAsked {
		h.mu.Unlock()
		return
	}
	h.confirmAsked = max(h.confirmAsked, r.confirm)
	h.req = hbRequest{through: max(r.through, h.req.through), cut: max(r.cut, h.req.cut), confirm: max(r.confirm, h.req.confirm)}
	h.asked.Store(max(h.asked.Load(), h.req.through))
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// askedThrough is the LSN of the latest heartbeat asked for (0 for a nil
// heartbeater).
func (h *heartbeater) askedThrough() uint64 {
	if h == nil {
		return 0
	}
	return h.asked.Load()
}

// failed returns the heartbeater's failure, if any.
func (h *heartbeater) failed() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// drain waits until every heartbeat asked for is published (or one
// failed: its error); the replication loop drains before a heartbeat of
// its own, so that two never wait for acknowledgements at once.
func (h *heartbeater) drain() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.err == nil && (h.busy || h.req.through != 0) {
		if h.stopped {
			return errHeartbeaterStopped
		}
		h.cond.Wait()
	}
	return h.err
}

// run publishes the heartbeats asked for until ctx ends or one fails;
// publish is Publisher.publishHeartbeat.
func (h *heartbeater) run(ctx context.Context, publish func(context.Context, hbRequest) error) {
	defer func() {
		h.mu.Lock()
		h.stopped, h.busy = true, false
		h.cond.Broadcast()
		h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		}
		h.mu.Lock()
		r := h.req
		h.req = hbRequest{}
		h.busy = r.through != 0
		h.mu.Unlock()
		if r.through == 0 {
			continue
		}
		err := publish(ctx, r)
		h.mu.Lock()
		h.busy = false
		if err != nil && h.err == nil {
			h.err = err
		}
		h.cond.Broadcast()
		h.mu.Unlock()
		if err != nil {
			h.interrupt()
			return
		}
	}
}
