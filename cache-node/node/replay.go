package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
)

// maxReplayGroups bounds the groups a replay filters on; past it a gap
// ends open versions instead.
const maxReplayGroups = 1000

// replayTimeout bounds a replay; past it a gap ends open versions.
const replayTimeout = 30 * time.Second

// startReplayLocked handles a reconnect without giving up open versions:
// the watermark stays where it was (versions are served only up to it),
// and JetStream's copy of the stream, from the first message after the
// watermark, is applied for every group the node follows until a heartbeat
// at or past `until` — the first heartbeat after the reconnect, routed
// after the subscriptions were restored, so everything later arrives live.
// It reports false when a replay cannot be tried.
func (n *Node) startReplayLocked(until uint64) bool {
	if n.replaying || len(n.groups) == 0 || len(n.groups) > maxReplayGroups {
		return false
	}
	subjects := []string{invalidation.HeartbeatSubject(n.cfg.Prefix)}
	for s := range n.bySubject {
		subjects = append(subjects, s)
	}
	n.replaying = true
	from := n.watermark
	n.m.replays.WithLabelValues("started").Inc()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), replayTimeout)
		defer cancel()
		err := n.replay(ctx, from, until, subjects)
		n.mu.Lock()
		defer n.mu.Unlock()
		n.replaying = false
		if err != nil {
			n.m.replays.WithLabelValues("failed").Inc()
			n.cfg.Log.Warn("replay failed: open versions end at the watermark", "err", err)
			n.endOpenLocked(context.Background(), "replay failed")
			return
		}
		n.m.replays.WithLabelValues("done").Inc()
		n.cfg.Log.Info("replayed the stream after a reconnect", "from", from, "to", n.watermark)
	}()
	return true
}

// replay applies the stream's messages after `from` on subjects until a
// heartbeat at or past `until`, then moves the watermark there.
func (n *Node) replay(ctx context.Context, from, until uint64, subjects []string) error {
	stream, err := n.js.Stream(ctx, invalidation.StreamName(n.cfg.Prefix))
	if err != nil {
		return err
	}
	start, err := firstSeqAfter(ctx, stream, from)
	if err != nil {
		return err
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
	})
	if err != nil {
		return err
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		type next struct {
			m   jetstream.Msg
			err error
		}
		ch := make(chan next, 1)
		go func() { m, err := it.Next(); ch <- next{m, err} }()
		var nx next
		select {
		case <-ctx.Done():
			it.Stop()
			return ctx.Err()
		case nx = <-ch:
		}
		if nx.err != nil {
			return nx.err
		}
		d, err := invalidation.Decode(nx.m.Data())
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		n.mu.Lock()
		if d.Heartbeat != nil {
			if d.Heartbeat.LSN >= until {
				if d.Heartbeat.LSN > n.watermark {
					n.watermark = d.Heartbeat.LSN
					n.setWatermarkLocked(n.watermark)
				}
				n.mu.Unlock()
				return nil
			}
			n.mu.Unlock()
			continue
		}
		err = n.applyLocked(ctx, nx.m.Subject(), d.Txn)
		n.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// firstSeqAfter finds the stream sequence of the first message with an
// LSN above lsn: the stream is in LSN order, so a binary search over
// sequences finds it.
func firstSeqAfter(ctx context.Context, s jetstream.Stream, lsn uint64) (uint64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	lo, hi := info.State.FirstSeq, info.State.LastSeq+1
	if info.State.Msgs == 0 {
		return lo, nil
	}
	if first, err := lsnAt(ctx, s, lo); err != nil {
		return 0, err
	} else if first > lsn {
		return 0, errors.New("replay: the stream no longer holds the messages after the watermark")
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		l, err := lsnAt(ctx, s, mid)
		if err != nil {
			return 0, err
		}
		if l > lsn {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// lsnAt is the LSN of the message at seq, or of the next one present.
func lsnAt(ctx context.Context, s jetstream.Stream, seq uint64) (uint64, error) {
	raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
	if err != nil {
		return 0, err
	}
	d, err := invalidation.Decode(raw.Data)
	if err != nil {
		return 0, err
	}
	return d.LSN(), nil
}
