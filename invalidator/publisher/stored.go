package publisher

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// that stores the stream. So the session does that de-duplication itself,
// once, at its start: it reads the stream back from its end (scanStored)
// and notes every (commit, subject) message stored in the last two
// minutes for a commit at or after the slot's position. It then publishes
// the messages of the commits it decodes without ids, and skips a found
// one only while it has published nothing on its subject: once it has
// (a message the scan did not find), every later message on that subject
// goes out again too, so that each subject's messages stay in commit
// order and its last message is its last change (cache-nodes read it when
// they subscribe). So a scan that finds only part of what is stored costs
// duplicates, never order; consumers take a repeated message as the same
// change again (an invalidation applied twice ends no more than once).
//
// The scan stops at the first message (going back) of a commit before
// the slot's position (one session publishes in commit order, and a slot
// streams to one session at a time, so what lies before it is older, but
// for what an earlier session stored and a later one skipped), at a
// message older than the window, or at a gap.
//
// When the scan fails, or would read more than storedScanLimit messages
// or take longer than storedScanTime (the walsender is not being answered
// meanwhile), nothing is skipped: every message is published again, in
// order, those of commits up to the WAL position read once the slot was
// the session's (every commit an earlier session can have decoded) with
// ids, which de-duplicate against copies that had ids too. A slot this
// session created starts past everything an earlier slot decoded, from a
// flush of every table: nothing to skip, no ids. Before the scan (that
// flush), every message carries an id.

// storedScanLimit bounds the messages read back from the stream at a
// session's start. Past it, the session publishes with message ids.
const storedScanLimit = 20000

// storedScanTime bounds the time the scan takes.
const storedScanTime = 20 * time.Second

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
	// idsThrough: messages of commits at or before it that are not
	// skipped get a message id (0: none does).
	idsThrough uint64
}

// allIDs is what a session knows before it has read the stream back:
// every message gets an id, none is skipped.
var allIDs = storedTail{idsThrough: math.MaxUint64}

// msgID decides what a message of the commit at lsn on subject needs,
// commits coming in order: skip (stored already), or the id to send it
// with (empty: none).
func (s *storedTail) msgID(dst []byte, lsn uint64, subject string) (id []byte, skip bool) {
	switch {
	case s.stored == nil:
	case lsn > s.through:
		s.stored, s.sent = nil, nil
	case s.stored[storedKey{lsn, subject}] && !s.sent[subject]:
		return dst, true
	default:
		s.sent[subject] = true
	}
	if lsn > s.idsThrough {
		return dst[:0], false
	}
	return appendMsgID(dst[:0], lsn, subject), false
}

// errScanLimit ends a scan that read storedScanLimit messages.
var errScanLimit = errors.New("too many messages to read back in time")

// scanStored reads the stream backwards from its end, once the session's
// epoch is stored (so that every message this connection sent before it
// is too), and returns what it holds of the commits at or after start,
// the slot's position. wal is the WAL insert position read once the slot was
// the session's; newSlot: this session created the slot.
func (p *Publisher) scanStored(ctx context.Context, start, wal uint64, newSlot bool) (storedTail, error) {
	if newSlot {
		return storedTail{}, nil
	}
	failed := storedTail{idsThrough: wal}
	stream, err := p.js.Stream(ctx, invalidation.StreamName(p.cfg.SubjectPrefix))
	if err != nil {
		return failed, fmt.Errorf("publisher: read the stream back: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return failed, fmt.Errorf("publisher: read the stream back: %w", err)
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
			return failed, errScanLimit
		}
		raw, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // deleted: the stream's history starts after it
		}
		if err != nil {
			return failed, fmt.Errorf("publisher: read the stream back at %d: %w", seq, err)
		}
		if time.Since(raw.Time) > dedupWindow {
			break // older than an id would have been remembered
		}
		if raw.Subject == hbSubj || raw.Subject == epochSubj {
			continue
		}
		// The server's clock (raw.Time) against this one: a skew only
		// cuts the scan shorter or longer, which costs duplicates or
		// time, not order.
		m, err := invalidation.Decode(raw.Data)
		if err != nil || m.Txn == nil {
			return failed, fmt.Errorf("publisher: read the stream back at %d: not a transaction (%v)", seq, err)
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
