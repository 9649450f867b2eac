package publisher

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/larderdb/larder/internal/invalidation"
)

func TestTmpReuse2(t *testing.T) {
	h := newHarness(t, ordDDL)
	cfg := h.config()
	cfg.TagColumns = ordSets()
	p1, _ := New(cfg)
	s1 := runSession(t, p1)
	h.readStream()
	third := newMilestone(600)
	go runWriters(t, h.url, h.prefix, 6, 300, third.note)
	<-third.ch
	ctx := context.Background()
	js, _ := jetstream.New(h.nc)
	stream, _ := js.Stream(ctx, invalidation.StreamName(h.prefix))
	info, _ := stream.Info(ctx)
	limited := info.Config
	limited.MaxMsgs = int64(info.State.Msgs) + 25
	limited.Discard = jetstream.DiscardNew
	js.UpdateStream(ctx, limited)
	<-s1.done
	t.Logf("s1: %v", s1.err)
	for i := 0; i < 2; i++ {
		start := time.Now()
		s2 := runSession(t, p1)
		<-s2.done
		t.Logf("session %d after %s: %v", i+2, time.Since(start), s2.err)
	}
}
