// Package publisher is the invalidator's core: it reads PostgreSQL's
// logical replication stream (pgoutput, through pglogrepl) from a durable
// slot, turns every committed transaction into the tags it changed — the
// table tag with the columns an UPDATE changed, and the keyed tag of every
// tag column set for the OLD and the NEW row — and publishes them on NATS
// JetStream in commit order, one message per transaction and subject.
//
// Heartbeats are small transactions holding a logical decoding message
// that the publisher itself commits every interval: when one's COMMIT is
// decoded, every earlier commit has been decoded too. The publisher then
// waits for JetStream to acknowledge every message so far, publishes the
// heartbeat and only then confirms its end to the slot, so a crash loses
// nothing: the next run resumes from the slot. It first reads back the
// previous session's messages and does not publish again what it finds
// stored, keeping each subject's last message its last change: the
// publisher de-duplicates once per session, where JetStream's message ids
// cost it a quarter of its work on every message (stored.go).
//
// Messages are handed to NATS without waiting: each asks for its own
// acknowledgement, and the acknowledgements are counted and awaited all
// at once, before each heartbeat (and after at most maxPending messages,
// when a catch-up backlog holds no heartbeat). The heartbeater does that
// waiting and publishes the heartbeats, off the replication loop, which
// hands each heartbeat over with the mark of the last message before it
// and goes on decoding (heartbeater.go).
//
// A message too large for NATS (a tag holding a value of megabytes) is
// replaced by a flush of its tables rather than stop the stream.
// WatchSlot exports the WAL the slot retains and its wal_status, also
// between sessions.
package publisher
