package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// events applies the server's keyevent notifications of evicted and
// expired values: each one drops the version's entry and index
// memberships at once, so that counts stay exact, the bookkeeping that has
// no TTL shrinks with the data, and a key that lost its last version is
// remembered for miss classification.
//
// Notifications are at most once: a version whose notification was lost
// (a reconnection) is dropped by the first script that meets it instead.
type events struct {
	s      *Store
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}

	seq     atomic.Uint64
	mu      sync.Mutex
	waiters map[string]chan struct{}
}

// retryPause is how long the subscriber waits before receiving again after
// an error (the client reconnects and subscribes again meanwhile).
const retryPause = 100 * time.Millisecond

func startEvents(ctx context.Context, s *Store, evicted, expired bool) (*events, error) {
	db := s.rdb.Options().DB
	var channels []string
	if evicted {
		channels = append(channels, fmt.Sprintf("__keyevent@%d__:evicted", db))
	}
	if expired {
		channels = append(channels, fmt.Sprintf("__keyevent@%d__:expired", db))
	}
	ps := s.rdb.Subscribe(ctx, channels...)
	// Wait for the confirmations: what is evicted after New returns is
	// seen.
	for confirmed := 0; confirmed < len(channels); {
		msg, err := ps.Receive(ctx)
		if err != nil {
			_ = ps.Close()
			return nil, fmt.Errorf("redisstore: subscribe to eviction notifications: %w", err)
		}
		if _, ok := msg.(*redis.Subscription); ok {
			confirmed++
		}
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	e := &events{s: s, ps: ps, cancel: cancel, done: make(chan struct{}), waiters: map[string]chan struct{}{}}
	go e.loop(loopCtx)
	return e, nil
}

func (e *events) loop(ctx context.Context) {
	defer close(e.done)
	defer e.releaseAll()
	for {
		msg, err := e.ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Whatever was in flight may be lost: release the waiters.
			e.releaseAll()
			select {
			case <-ctx.Done():
				return
			case <-time.After(retryPause):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Message:
			e.apply(ctx, m.Payload)
		case *redis.Pong:
			e.release(m.Payload)
		}
	}
}

// apply handles one evicted or expired key.
func (e *events) apply(ctx context.Context, name string) {
	rest, ok := strings.CutPrefix(name, e.s.p+"v:")
	if !ok || len(rest) < 8 {
		return
	}
	// An error leaves the version to the lazy cleanup.
	_ = e.s.run(ctx, e.s.sc.forgetEvicted, nil, e.s.p, rest[8:], rest[:8]).Err()
}

// sync returns once every notification the server sent before it has been
// applied: a PING on the subscription comes back after them.
func (e *events) sync(ctx context.Context) error {
	token := "larder-sync-" + strconv.FormatUint(e.seq.Add(1), 10)
	ch := make(chan struct{})
	e.mu.Lock()
	e.waiters[token] = ch
	e.mu.Unlock()
	if err := e.ps.Ping(ctx, token); err != nil {
		e.release(token)
		return nil // the subscriber is reconnecting: nothing to wait for
	}
	select {
	case <-ch:
		return nil
	case <-e.done:
		return nil
	case <-ctx.Done():
		e.release(token)
		return ctx.Err()
	}
}

func (e *events) release(token string) {
	e.mu.Lock()
	if ch, ok := e.waiters[token]; ok {
		close(ch)
		delete(e.waiters, token)
	}
	e.mu.Unlock()
}

func (e *events) releaseAll() {
	e.mu.Lock()
	for t, ch := range e.waiters {
		close(ch)
		delete(e.waiters, t)
	}
	e.mu.Unlock()
}

func (e *events) close() {
	e.cancel()
	_ = e.ps.Close()
	<-e.done
}
