package invalidation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// DefaultPrefix is the first token of every Larder subject.
const DefaultPrefix = "larder"

// Subjects (with prefix p):
//
//	p.inv.<h>   invalidations of the tag whose canonical name hashes to h
//	p.inv.<f>   flushes of a table (h of "flush:" + table name)
//	p.hb        heartbeats
//	p.schema.changed  notices of decoded schema changes (core NATS)
//	p.config.tagsets  request/reply: coverage and tag column sets
//	p.config.tagsets.register  request/reply: publish more tag column sets
//
// h is the first 8 bytes of SHA-256 of the name, in hex: fixed length, no
// user data in subject names. Two names hashing alike only make a
// subscriber receive changes it then ignores (messages carry the names).

// TagSubject returns the subject a tag's changes travel on.
func TagSubject(prefix, tag string) string { return prefix + ".inv." + hashName(tag) }

// FlushSubject returns the subject of a table's flushes.
func FlushSubject(prefix, table string) string { return prefix + ".inv." + hashName("flush:"+table) }

// EpochSubject carries, in the stream, a message the invalidator
// publishes when a replication session starts, before any other of the
// session: a Txn whose CommitLSN is the LSN the session resumes from.
// Commits after it are published under the session's configuration (its
// tag column sets); what came before may have been published under
// another. A cache-node therefore never counts a group's history as
// complete from before the last epoch: a subject without messages may
// simply not have been published then.
func EpochSubject(prefix string) string { return prefix + ".inv." + hashName("epoch:") }

// EpochMsgID is the JetStream message id of a session's epoch message.
func EpochMsgID(lsn uint64) string { return fmt.Sprintf("epoch/%X", lsn) }

// TagSetsSubject answers requests with the tables the invalidator covers
// and the tag column sets it publishes (JSON TagSetsReply). The reply
// follows schema changes (see SchemaChangedSubject) and registrations.
func TagSetsSubject(prefix string) string { return prefix + ".config.tagsets" }

// HeartbeatSubject returns the heartbeat subject.
func HeartbeatSubject(prefix string) string { return prefix + ".hb" }

// StreamSubjects lists the subjects of the JetStream stream.
func StreamSubjects(prefix string) []string {
	return []string{prefix + ".inv.*", HeartbeatSubject(prefix)}
}

// StreamName returns the JetStream stream name for a prefix.
func StreamName(prefix string) string {
	return strings.ToUpper(strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(prefix)) + "_INVALIDATIONS"
}

// MsgID is the JetStream message id of a transaction's message on a
// subject: republishing after a crash is de-duplicated by the stream.
func MsgID(commitLSN uint64, subject string) string {
	return fmt.Sprintf("%X/%s", commitLSN, subject[strings.LastIndexByte(subject, '.')+1:])
}

// HeartbeatMsgID is the JetStream message id of a heartbeat.
func HeartbeatMsgID(lsn uint64) string { return fmt.Sprintf("hb/%X", lsn) }

// ValidPrefix reports whether p can prefix subjects.
func ValidPrefix(p string) error {
	if p == "" || strings.ContainsAny(p, " \t\r\n*>") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
		return fmt.Errorf("invalidation: %q is not a valid subject prefix", p)
	}
	return nil
}

func hashName(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
