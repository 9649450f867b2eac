// Package wan measures Larder across a wide-area link: an edge site
// (the application, client-lib and its cache-node) far from PostgreSQL,
// with the link emulated by toxiproxy in this process (a bandwidth shared
// by every connection in each direction, and a one-way delay of half the
// round trip).
//
// Three configurations of the edge application are compared at each link
// setting (Settings: 5 Mb/s with 66 ms RTT, 20 Mb/s with 33 ms, 100 Mb/s
// with none):
//
//   - direct: the application's pgx pool reaches PostgreSQL over the link;
//   - origin-rows: Larder at the edge, its misses run by an origin next to
//     PostgreSQL (cache-node/origin) with every row sent verbatim
//     (larder.origin-rows=0: no recipes);
//   - origin-recipes: the same with row recipes (the edge's row store).
//
// In the Larder configurations everything the edge still needs from the
// database's site crosses the same link: the client's own PostgreSQL
// connection (fresh snapshots, writes, fallbacks), NATS (pins and
// invalidations, for the edge's cache-node and client; or a leaf node at
// the edge, Config.Leaf) and the origin's connection. The bytes each
// carried are counted by the link.
//
// The load is the RUBiS emulator's walk (bench/rubis/mix) run by Go
// virtual users over HTTP against the RUBiS application (bench/rubis/app)
// served in this process, and a data-heavy page set (Listing: every open
// item of a category with its description, while a writer bids) where
// misses carry many rows that the edge mostly holds already.
//
// The harness runs briefly in `go test` (tiny data, no timing
// assertions); `make bench-wan` runs it at full length (cmd/wan-bench).
package wan
