// Package pincushion keeps exact pinned snapshots of PostgreSQL.
//
// A pin is an exported snapshot (pg_export_snapshot) held open in its own
// REPEATABLE READ transaction, so that clients can run cache misses on it
// with SET TRANSACTION SNAPSHOT. Every pin carries a timestamp, a commit
// LSN T, and is exact: its snapshot sees precisely the transactions whose
// commit LSN is <= T. It also carries the server's start time
// (pg_postmaster_start_time(), read with the snapshot): exported snapshot
// ids repeat across server restarts, and clients import a pin only on a
// connection to the server run that exported it.
//
// PostgreSQL builds snapshots from the proc array, whose order can differ
// from WAL order for concurrent commits: a snapshot can see a transaction
// that committed later in the WAL and miss one that committed earlier. Such
// a snapshot equals no prefix of the commit stream and has no timestamp.
// The pincushion therefore checks every candidate against the decoded
// commit stream (CommitLog, fed by the replication decoder) with Verify,
// and discards the ones that are not a prefix.
//
// Exactness is with respect to the decoded commit stream: a transaction
// the decoder never reports (one that changed no published table) is
// neither checked nor part of any timestamp.
//
// The Cushion takes a candidate every Interval, keeps the exact ones,
// expires them after MaxStaleness, thins them to a budget of open
// connections (dense recent, sparse old), announces new pins on NATS,
// answers list requests, and verifies snapshots that clients took
// themselves ("now" snapshots).
package pincushion
