// Package recipe is the row-recipe codec that carries query results over a
// WAN between an origin next to PostgreSQL and an edge site (Ganesh, WWW
// 2007; the whole-result check of Tolia's Cedar).
//
// # Model
//
// A Result is an encoded query result cut at row boundaries: a header
// (column descriptions) and rows, each an opaque byte string. The origin
// keeps, per edge, a Tracker: the hashes of the rows it believes the
// edge's RowStore holds, never the rows. Tracker.AppendRecipe encodes a
// result for that edge as a recipe: the header verbatim, then per row
// either its bytes or, for a row the Tracker believes held, its 16-byte
// reference. The edge's RowStore.Decode (or ParseRecipe + Rebuild)
// resolves the references, checks the whole-result hash, and records the
// rows.
//
// # Keeping the two sides in step
//
// Both sides run the same LRU code (lru.go) under the same Config over the
// same sequence of deliveries: for every row of a delivered result, in
// order, a row of at least MinStoredRow bytes whose Charge fits the
// budget becomes the most recently used row, inserted if absent, and the
// least recently used rows are evicted while the budget (bytes and rows)
// is exceeded. The origin records a delivery when it encodes it; the
// edge when it has rebuilt and verified it. References are chosen against
// the origin's model as the recipe is encoded (so a row repeated within a
// result is sent once) and resolved against the edge's store as it was
// before the delivery plus the recipe's own earlier rows.
//
// Whenever the sides disagree — a lost or failed delivery, an edge that
// restarted without telling the origin, concurrent deliveries applied in
// another order, a different Config — the edge meets a reference it
// cannot resolve, asks for exactly those rows in one batched Refetch, and
// the refetched rows are recorded like any other: the disagreement heals
// and costs bytes, never a wrong result. An edge that empties its store
// sends AppendReset so the origin empties its model (Tracker.Reset). An
// origin that restarted with an empty model needs nothing: its verbatim
// rows become newer than everything the edge held, so the edge evicts its
// stale rows first and converges to the origin's model.
//
// # Hashes and the collision bound
//
// Rows are hashed with SHA-256 (hash.go says why not BLAKE3). A
// reference is the first 128 bits (RefSize); the whole-result hash is
// SHA-256 over the header and the row count and every row's full 256-bit
// hash, in order (Cedar's check).
//
// Truncating references to 128 bits is safe for two separate reasons:
//
//   - Probability. A wrong substitution needs two distinct rows with the
//     same 128-bit prefix in one edge's lifetime. For n distinct rows the
//     birthday bound is n²/2¹²⁹: even after 2³² (four billion) distinct
//     rows it is below 2⁻⁶⁵. Forcing one on purpose, by writing chosen rows
//     into the database, takes about 2⁶⁴ SHA-256 evaluations.
//   - Detection. Even then the result is not wrong: the edge computes
//     every row's full hash from the bytes it holds and checks the
//     whole-result hash, which binds the full hashes. A collision shows up
//     as a mismatch, the edge refetches the whole result verbatim, and
//     the newer row replaces the colliding one in its store. A wrong
//     result would need a collision of SHA-256 itself.
//
// # Limits and hostile input
//
// Every parser refuses an unknown version or kind, trailing bytes, runs and
// counts that cannot fit in the bytes left, and counts over Limits, with
// errors wrapping ErrVersion, ErrKind, ErrCorrupt or ErrTooLarge; none
// panics (fuzzed: FuzzParseRecipe, FuzzRebuild, FuzzParseFill,
// FuzzParseRefetch, FuzzParseReset). Allocations are bounded by the
// message's size: every row takes at least one byte of it, and a parsed
// row takes 48 bytes, so a recipe's parts take at most 48 bytes per byte
// of message, and Limits.MaxRows bounds their number. A recipe can name a
// result much larger than itself through references; Rebuild checks
// Limits.MaxResultBytes before handing it out, and the result aliases the
// store's rows rather than copying them. FORMAT.md beside this file is the
// byte layout.
//
// # Users
//
// The origin (package cache-node/origin, command larder-origin) keeps a
// Tracker per edge and encodes each miss it runs; client-lib's Loader
// through an origin (client-lib/origin.go) holds the edge's RowStore and
// decodes with one batched refetch over the origin session.
// cache-node/origin/README.md describes the transport.
//
// # Concurrency
//
// Tracker and RowStore are safe for concurrent use; hashing runs outside
// their locks. The package-level functions keep no state. Parsed messages
// (Recipe, Fill, Refetch) and rebuilt Results are values the package
// never modifies once returned: safe to read from several goroutines.
package recipe
