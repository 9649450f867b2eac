// Package larder is the library applications link to read PostgreSQL
// through Larder's cache with transactional consistency.
//
// A read-only transaction (BeginRO) gets a staleness limit. Its candidates
// are the pincushion's exact pinned snapshots taken within that limit (and
// at or after its session's last commit: read your writes; see Session). Each query
// looks in the L1, then on the key's cache-node, for a result valid
// somewhere in the span the candidates still cover; a hit narrows the
// candidates to its validity interval. A miss fixes the transaction at the
// newest candidate (SET TRANSACTION SNAPSHOT; a pin exported by another
// run of the PostgreSQL server than the connection's is dropped instead:
// snapshot ids repeat across restarts), runs there, and puts the
// result into the L1 and, asynchronously, the cache-node with the tags
// qumaana computes for it. Every result therefore equals the result at one
// snapshot. With no usable pin the transaction runs uncached on a fresh
// snapshot (counted as a fallback). Read/write transactions (BeginRW) go
// straight to PostgreSQL. A read-only transaction at a pin that ran only
// cacheable reads stays open on its connection for Config.ParkIdle when it
// ends, so that the next one at the same pin there begins on it without a
// snapshot import (parked.go); a transaction prefers an older candidate
// pin, at most Config.ParkPrefer older than its newest, with a transaction
// parked there.
//
// Only PostgreSQL can make a transaction fail or wait long. Open needs
// PostgreSQL alone: NATS, the invalidator's pins and tag sets and the
// cache-nodes are picked up when they answer, and until then read-only
// transactions run uncached. Each cache-node call has a deadline
// (Config.NodeTimeout, at most half of what is left of the caller's), and
// a per-node circuit breaker sends a failing node's reads straight to
// PostgreSQL, as misses, until a probe after Config.NodeBackoff finds it
// answering. A transaction that needs a fresh snapshot waits for the
// pincushion to place it at most Config.FreshReadWait, then reads on
// PostgreSQL at it until placed; it gives up on the placement after
// Config.PinVerifyTimeout, and does not ask while the pincushion places
// no pins (Config.PinSilence) or NATS is away: it runs uncached on a
// fresh snapshot. Stats and the larder_client_* metrics count each of
// these.
//
// A Session is the unit of read-your-writes: it travels in a context
// (WithSession), as a token between processes, and as a cookie for a web
// application (HTTPSessions). A transaction whose context carries none
// belongs to its client's own session, which every write through the
// client moves.
//
// Importing the package registers the database/sql driver "larder" (see
// Driver).
package larder
