package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
)

// A session resumes from the slot's confirmed position, and the sessions
// before it may have stored some of what it decodes again: what came
// after the last confirmation, up to the crash. Message ids (JetStream's
// de-duplication: a message whose id the stream stored in the last two
// minutes is dropped) used to catch those copies, but JetStream pays for
// an id on every message (its header read, the id remembered for the
// window): about a quarter of its work per message, in the one goroutine
// that stores the stream. So transaction messages carry no id, and the
// session de-duplicates itself, once, at its start: it reads back the
// previous session's messages (scanStored) and notes every (commit,
// subject) message stored in the last two minutes for a commit at or
// after the slot's position.
//
// It then publishes the messages of the commits it decodes, and skips a
// found one only while it has published nothing on its subject: once it
// has (a message the scan did not find), every later message on that
// subject goes out again too. So each session's own messages on a subject
// are in commit order, and the stream's last message on a subject is its
// last change (cache-nodes read it when they subscribe). Whatever the scan
// misses costs a duplicate, published in order; consumers take a repeated
// message as the same change again (an invalidation applied twice ends no
// more than once).
//
// The scan reads back only the previous session's messages (it stops at
// the epoch before its own, which is the stream's last message, unless
// JetStream dropped it as the previous session's, at the same position):
// those are in commit order on each subject,
// what lies before them need not be (an earlier session's message the
// previous one skipped as stored, then published an older one on its
// subject). It also stops at the first message of a commit before the
// slot's position (a session publishes in commit order), at a message
// older than the window (as an id would have been forgotten), and at a
// gap. A scan that fails, or would read more than storedScanLimit messages
// or take longer than storedScanTime (the walsender is not answered
// meanwhile), skips nothing: everything is published again, in order. A
// slot this session created starts past everything an earlier slot
// decoded, from a flush of every table: there is nothing to skip.

// storedScanLimit bounds the messages read back from the stream at a
// session's start.
const storedScanLimit = 20000

// storedScanTime bounds the time the scan takes.
const storedScanTime = 10 * time.Second

// dedupWindow is the stream's de-duplication window (its Duplicates).
const dedupWindow = 2 * time.Minute

// storedKey names one message of a transaction.
type storedKey struct {
	lsn     uint64
	subject string
}

// storedTail is what a session found in the stream at its start.
type storedTail struct {
	// stored holds the messages stored (in the last dedupWindow) for
	// commits at or after the slot's position; through is the largest
	// commit among them. Past it they are forgotten.
	stored  map[storedKey]bool
	through uint64
	// sent holds the subjects the session published a message on while
	// stored lasts: their later messages are published even when found.
	sent map[string]bool
}

// skip decides whether the message of the commit at lsn on subject is
// stored already and not to be published again, commits coming in order.
func (s *storedTail) skip(lsn uint64, subject string) bool {
	switch {
	case s.stored == nil:
	case lsn > s.through:
		s.stored, s.sent = nil, nil
	case s.stored[storedKey{lsn, subject}] && !s.sent[subject]:
		return true
	default:
		s.sent[subject] = true
	}
	return false
}

// errScanLimit ends a scan that read storedScanLimit messages.
var errScanLimit = errors.New("too many messages to read back in time")

// scanStored reads the stream backwards from its end, once the session's
// epoch is stored (so that every message this connection sent before it
// is too), and returns what the previous session stored of the commits at
// or after start, the slot's position. newSlot: this session created the
// slot.
func (p *Publisher) scanStored(ctx context.Context, start uint64, newSlot bool) (storedTail, error) {
	if newSlot {
		return storedTail{}, nil
	}
	stream, err := p.js.Stream(ctx, invalidation.StreamName(p.cfg.SubjectPrefix))
	if err != nil {
		return storedTail{}, fmt.Errorf("publisher: read the stream back: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return storedTail{}, fmt.Errorf("publisher: read the stream back: %w", err)
	}
	var (
		stored    = map[storedKey]bool{}
		through   uint64
		began     = time.Now()
		hbSubj    = invalidation.HeartbeatSubject(p.cfg.SubjectPrefix)
		epochSubj = invalidation.EpochSubject(p.cfg.SubjectPrefix)
		read      int
	)
	for seq := info.State.LastSeq; seq > 0 && seq >= info.State.FirstSeq; seq-- {
		if read++; read > storedScanLimit || time.Since(began) > storedScanTime {
			return storedTail{}, errScanLimit
		}
		raw, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // deleted: the stream's history starts after it
		}
		if err != nil {
			return storedTail{}, fmt.Errorf("publisher: read the stream back at %d: %w", seq, err)
		}
		// The server's clock (raw.Time) against this one: a skew cuts
		// the scan shorter or longer, which costs duplicates or time.
		if time.Since(raw.Time) > dedupWindow {
			break // older than an id would have been remembered
		}
		if raw.Subject == epochSubj {
			if seq == info.State.LastSeq {
				continue // this session's own, just stored
			}
			// The previous session's start (or this one's, when JetStream
			// took this epoch for that one's: the same position, by id).
			break
		}
		if raw.Subject == hbSubj {
			continue
		}
		m, err := invalidation.Decode(raw.Data)
		if err != nil || m.Txn == nil {
			return storedTail{}, fmt.Errorf("publisher: read the stream back at %d: not a transaction (%v)", seq, err)
		}
		if m.Txn.CommitLSN < start {
			// Not decoded again (a commit at start is: the slot skips
			// those whose commit record begins before it), nor is any
			// message before it.
			break
		}
		stored[storedKey{m.Txn.CommitLSN, raw.Subject}] = true
		through = max(through, m.Txn.CommitLSN)
	}
	if len(stored) == 0 {
		return storedTail{}, nil
	}
	return storedTail{stored: stored, through: through, sent: map[string]bool{}}, nil
}
