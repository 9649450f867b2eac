// Package pgfront is a PostgreSQL wire-protocol front for the Larder
// library: psql, libpq (PHP's pgsql and PDO_pgsql) and any other
// PostgreSQL driver use Larder by connecting to its port instead of
// PostgreSQL's.
//
// # Sessions
//
// Each client connection gets a PostgreSQL connection of its own, opened
// as the client's user and database: the front relays the start-up and
// the authentication exchange (cleartext, MD5, SCRAM-SHA-256) message by
// message, and PostgreSQL's ParameterStatus and BackendKeyData as they
// come; a cancel request naming a session is forwarded to PostgreSQL with
// the key PostgreSQL gave it. The front answers SSLRequest 'N' unless
// Config.TLS is set, and GSSENCRequest 'N'; it can use TLS towards
// PostgreSQL (Config.PostgresTLS). Replication connections and GSSAPI
// authentication are refused.
//
// # Relayed
//
// Everything that is not part of a Larder transaction passes to
// PostgreSQL unchanged on the session's connection, and PostgreSQL's
// answers come back byte for byte: simple and extended query protocol,
// COPY, notices, notifications, errors with every field. The session
// therefore has exactly PostgreSQL's behaviour, its own writes included.
//
// # Larder transactions
//
// A transaction begun at idle with BEGIN READ ONLY or START TRANSACTION
// READ ONLY (not SERIALIZABLE) is a Larder read-only transaction, on the
// same connection (its roles and settings are the results' keys). Its
// staleness limit is larder.staleness, which the front answers itself:
// SET larder.staleness = '5s' (the session's; a rollback does not undo
// it), SET LOCAL larder.staleness (this transaction's, before its first
// query), RESET, SHOW; Config.DefaultStaleness until set.
//
// In a Larder transaction queries (SELECT, VALUES, TABLE, WITH … SELECT)
// are answered through the library: the L1, the key's cache-node, or
// PostgreSQL at the transaction's snapshot. The answer is what PostgreSQL
// sends for the statement and the formats asked for, byte for byte:
// RowDescription, DataRow, CommandComplete "SELECT n", ReadyForQuery 'T';
// the cache key holds the result formats. SHOW, EXPLAIN, cursors without
// HOLD, FETCH, MOVE, CLOSE and EXECUTE run at the snapshot uncached;
// writes are refused as PostgreSQL refuses them in a read-only transaction
// (25006); other statements (SET, SAVEPOINT, LISTEN, …) with 0A000. A
// transaction the library cannot continue at one snapshot fails with
// 40001 (serialization_failure): the client runs it again. Extended
// protocol works as PostgreSQL's (named and unnamed statements and
// portals, text and binary parameters and results, Execute row limits;
// a statement runs before its Bind is answered, so that PostgreSQL's
// errors of a parameter or of planning answer the Bind, as they do there);
// a Parse is answered from a description PostgreSQL gave for the same
// text in the same session state, without a round trip, and the statement
// is prepared on PostgreSQL when the transaction ends.
//
// Statements outside Larder transactions that may write move the
// session's larder.Session: its next Larder transaction reads at or after
// them (read your writes), as the database/sql driver's connections do.
//
// # Not handled
//
// SET default_transaction_read_only = on does not make BEGIN a Larder
// transaction; BEGIN followed by SET TRANSACTION READ ONLY stays
// PostgreSQL's. A BEGIN READ ONLY or SET larder.staleness that follows
// another executed statement in one extended-protocol pipeline (no Sync
// between) goes to PostgreSQL as it is. A session whose client_encoding
// is not UTF8, or whose standard_conforming_strings is off, runs its
// Larder transactions uncached. Session state changed by a function
// inside a Larder transaction (set_config) is rolled back with it.
//
// # Concurrency
//
// A Front is safe for concurrent use; each session runs on two
// goroutines of its own (see session and pump).
package pgfront
