// Package larder is the library applications link to read PostgreSQL
// through Larder's cache with transactional consistency.
//
// A read-only transaction (BeginRO) gets a staleness limit. Its candidates
// are the pincushion's exact pinned snapshots taken within that limit (and
// at or after its session's last commit: read your writes; see Session). Each query
// looks in the L1, then on the key's cache-node, for a result valid
// somewhere in the span the candidates still cover; a hit narrows the
// candidates to its validity interval. A miss fixes the transaction at the
// newest candidate (SET TRANSACTION SNAPSHOT), runs there, and puts the
// result into the L1 and, asynchronously, the cache-node with the tags
// qumaana computes for it. Every result therefore equals the result at one
// snapshot. With no usable pin the transaction runs uncached on a fresh
// snapshot (counted as a fallback). Read/write transactions (BeginRW) go
// straight to PostgreSQL.
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
