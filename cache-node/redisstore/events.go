package redisstore

import (
	"context"
	"errors"
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

	// probeKey, while probe runs, is its key; probeSeen is set when the
	// key's expiry is notified.
	probeKey  atomic.Pointer[string]
	probeSeen atomic.Bool
}

// retryPause is how long the subscriber waits before receiving again after
// an error (the client reconnects and subscribes again meanwhile).
const retryPause = 100 * time.Millisecond

// errNoChannelRights: the Redis user may not subscribe to the
// notifications.
var errNoChannelRights = errors.New("the Redis user may not subscribe to the keyevent notifications of evicted and expired keys " +
	"(grant &__keyevent@*__:evicted and &__keyevent@*__:expired)")

// startEvents subscribes to the keyevent notifications of evicted and
// expired keys, whether the server sends them or not: only the server's
// setting decides, and a subscription that receives nothing costs
// nothing.
func startEvents(ctx context.Context, s *Store) (*events, error) {
	db := s.rdb.Options().DB
	channels := []string{fmt.Sprintf("__keyevent@%d__:evicted", db), fmt.Sprintf("__keyevent@%d__:expired", db)}
	ps := s.rdb.Subscribe(ctx, channels...)
	// Wait for the confirmations: what is evicted after New returns is
	// seen.
	for confirmed := 0; confirmed < len(channels); {
		msg, err := ps.Receive(ctx)
		if err != nil {
			_ = ps.Close()
			if redis.HasErrorPrefix(err, "NOPERM") {
				return nil, errNoChannelRights
			}
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

// probeTries bounds how long probe waits for its key to expire (a
// millisecond per try).
const probeTries = 1000

// probe reports whether the server's keyevent notifications of expired
// keys reach the subscriber, which tells notify-keyspace-events without
// CONFIG GET: it sets key to expire in a millisecond, reads it until it is
// gone (a read of a key past its time expires it at once, and the
// notification is sent then), and waits until every notification sent
// before is applied.
func (e *events) probe(ctx context.Context, key string) (bool, error) {
	e.probeKey.Store(&key)
	defer e.probeKey.Store(nil)
	if err := e.s.rdb.Set(ctx, key, "", time.Millisecond).Err(); err != nil {
		return false, err
	}
	for try := 0; ; try++ {
		if try == probeTries {
			return false, fmt.Errorf("%s did not expire", key)
		}
		time.Sleep(time.Millisecond)
		n, err := e.s.rdb.Exists(ctx, key).Result()
		if err != nil {
			return false, err
		}
		if n == 0 {
			break
		}
	}
	if err := e.sync(ctx); err != nil {
		return false, err
	}
	return e.probeSeen.Load(), nil
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
	if k := e.probeKey.Load(); k != nil && name == *k {
		e.probeSeen.Store(true)
		return
	}
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
