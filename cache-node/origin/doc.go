// Package origin serves an edge site's misses next to PostgreSQL and
// answers them as row recipes (internal/recipe), so that a miss crossing
// a WAN carries only the rows the edge does not hold.
//
// # Model
//
// An edge transaction (client-lib's read-only transaction, through its
// Loader) that misses at a pin opens a session here: Begin imports the
// pin's exported snapshot on a PostgreSQL connection of the origin's,
// holds the tables and checks their storage (the Backend: client-lib's
// own transaction machinery, larder.OriginBackend), Query runs a
// statement there and answers with a recipe encoded by the edge's
// recipe.Tracker, Refetch answers the edge's one batched refetch from the
// last result, End ends the transaction. The consistency of the
// transaction is the edge's: the origin only reads at the pin it is
// given, with the same checks as the edge would.
//
// # Protocol
//
// Frames are the cache-node protocol's (protocol.WriteFrame/ReadFrame);
// the first request on a connection is a Hello carrying ProtoVersion, the
// edge id and its row store budget (and a reset). README.md lists the
// messages; every decoder is fuzzed (FuzzDecode).
//
// # Bounds
//
// Config.MaxSessions bounds the sessions open (a begin beyond it is
// answered ErrBusy: the edge begins on its own connection instead),
// Config.IdleTimeout ends a session whose connection is silent,
// Config.StatementTimeout bounds each request, Config.MaxEdges the edges
// modelled.
//
// # Concurrency
//
// Server and Client are safe for concurrent use; a Session is used by one
// goroutine at a time. A connection serves one session at a time.
package origin
