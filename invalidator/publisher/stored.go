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
// de-duplication) would catch those copies, but JetStream pays for an id
// on every message (its header read, the id remembered for the
// de-duplication window): about a quarter of its work per message. So
// the session finds out, once at its start, what the stream holds
// (scanStored), and publishes:
//
//   - nothing for a commit at or before the stream's last heartbeat: a
//     heartbeat is published only once every message before it is
//     acknowledged;
//   - nothing for a (commit, subject) message found stored past it;
//   - every other message without an id: it is not in the stream.
//
// The last holds because one session publishes in commit order, and a
// slot streams to one session at a time: going back from the stream's
// end, once a message of a commit at or before the heartbeat is reached,
// every message before it is of such a commit too. (A stream out of
// commit order, left by a session that republished what a refusal had
// left out, can hold a later commit before that point; its copy is then
// stored twice. Consumers take a repeated message as the same change
// again: an invalidation applied twice ends no more than once.)
//
// The stream's own history counts only when it can be the database's:
// its last heartbeat is recent (within the stream's de-duplication
// window, as message ids were) and not past the WAL position. Otherwise
// nothing is skipped, and the messages of commits up to the WAL position
// read once the slot was the session's (every commit an earlier session
// can have decoded) carry ids, as they all used to; so too when the scan
// fails or would read more than storedScanLimit messages. A slot this
// session created starts past everything an earlier slot decoded, from a
// flush of every table: nothing to skip, no ids. Before the scan (that
// flush), every message carries an id.

// storedScanLimit bounds the messages read back from the stream at a
// session's start. Past it, the session publishes with message ids.
const storedScanLimit = 100000

// dedupWindow is the stream's de-duplication window (its Duplicates).
const dedupWindow = 2 * time.Minute

// storedKey names one message of a transaction.
type storedKey struct {
	lsn     uint64
	subject string
}

// storedTail is what a session found in the stream at its start.
type storedTail struct {
	// heartbeat is the stream's last heartbeat (its largest LSN): every
	// commit at or before it is stored (0: none known).
	heartbeat uint64
	// past holds the messages stored for commits after heartbeat.
	past map[storedKey]bool
	// idsThrough: messages of commits at or before it that are not
	// skipped get a message id (0: none does).
	idsThrough uint64
}

// allIDs is what a session knows before it has read the stream back:
// every message gets an id, none is skipped.
var allIDs = storedTail{idsThrough: math.MaxUint64}

// msgID decides what a message of the commit at lsn on subject needs:
// skip (stored already), or the id to send it with (empty: none).
func (s *storedTail) msgID(dst []byte, lsn uint64, subject string) (id []byte, skip bool) {
	if (s.heartbeat != 0 && lsn <= s.heartbeat) || s.past[storedKey{lsn, subject}] {
		return dst, true
	}
	if lsn > s.idsThrough {
		return dst[:0], false
	}
	return appendMsgID(dst[:0], lsn, subject), false
}

// errScanLimit ends a scan that read storedScanLimit messages.
var errScanLimit = errors.New("too many messages after the last heartbeat")

// scanStored reads the stream backwards from its end, once the session's
// epoch is stored (so that every message of this connection before it is
// too), and returns what it holds past its last heartbeat. wal is the WAL
// insert position read once the slot was the session's; newSlot: this
// session created the slot.
func (p *Publisher) scanStored(ctx context.Context, wal uint64, newSlot bool) (storedTail, error) {
	if newSlot {
		return storedTail{}, nil
	}
	tail := storedTail{idsThrough: wal} // unless the scan succeeds
	stream, err := p.js.Stream(ctx, invalidation.StreamName(p.cfg.SubjectPrefix))
	if err != nil {
		return tail, fmt.Errorf("publisher: read the stream back: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return tail, fmt.Errorf("publisher: read the stream back: %w", err)
	}
	var (
		hb        *invalidation.Heartbeat
		past      = map[storedKey]bool{}
		hbSubj    = invalidation.HeartbeatSubject(p.cfg.SubjectPrefix)
		epochSubj = invalidation.EpochSubject(p.cfg.SubjectPrefix)
		read      int
	)
	for seq := info.State.LastSeq; seq > 0 && seq >= info.State.FirstSeq; seq-- {
		if read++; read > storedScanLimit {
			return tail, errScanLimit
		}
		raw, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // deleted: the stream's history starts after it
		}
		if err != nil {
			return tail, fmt.Errorf("publisher: read the stream back at %d: %w", seq, err)
		}
		m, err := invalidation.Decode(raw.Data)
		if err != nil {
			return tail, fmt.Errorf("publisher: read the stream back at %d: %w", seq, err)
		}
		if m.Heartbeat != nil {
			if raw.Subject == hbSubj && (hb == nil || m.Heartbeat.LSN > hb.LSN) {
				h := *m.Heartbeat
				hb = &h
			}
			continue
		}
		if m.Txn == nil || raw.Subject == epochSubj {
			continue // an epoch is at its session's start, before what it republished
		}
		if hb != nil && m.Txn.CommitLSN <= hb.LSN {
			// Within a session messages go in commit order: everything
			// before this one is at or before the heartbeat too.
			break
		}
		past[storedKey{m.Txn.CommitLSN, raw.Subject}] = true
	}
	if hb == nil {
		// No heartbeat (a new stream): only what was read counts.
		hb = &invalidation.Heartbeat{Time: time.Now()}
	}
	if hb.LSN > wal || time.Since(hb.Time) > dedupWindow {
		// Another history than the database's, or an old one: ids.
		return tail, nil
	}
	return storedTail{heartbeat: hb.LSN, past: past}, nil
}
