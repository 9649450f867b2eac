// Package explain says what Larder does with one SQL statement: whether a
// read-only transaction caches its result and, if not, why (the
// analyzer's reason and the rewrite that would make it cacheable); whether
// it reads the clock and is therefore cached per clock bucket (the SQL a
// client runs instead); its template id; the tags its results hold, with
// the tag column set each dependency keys on or the reason it holds its
// table's tag; and the columns it reads. It is what `qumaana explain`
// prints.
//
// # The analysis
//
// Statement analyzes the text exactly as client-lib does online: with
// quma.Analyzer, against a schema, keyed on the tag column sets of the
// QUMA file the clients load. Without a QUMA file, the sets are those the
// statement's own analysis proposes (what `qumaana analyze` given only this
// statement would choose), and the report says so.
//
// # Live figures
//
// Scrape reads Prometheus text endpoints — cache-nodes, applications that
// export client-lib's metrics, invalidators — and adds up, over all of
// them, the figures of one template:
//
//   - client reads by source (larder_client_template_reads_total): calls
//     and the hit rate (l1 and node over all reads); and the clients' L1
//     misses by class (larder_client_template_misses_total{cache="l1"});
//   - cache-node lookups by result (larder_node_template_lookups_total):
//     hits and misses by class — compulsory, staleness, capacity,
//     consistency, TxCache's classification;
//   - cache-node puts and their bytes (larder_node_template_puts_total,
//     larder_node_template_put_bytes_total). Bytes held are not counted
//     per template; the report approximates them as the template's share
//     of each node's bytes put times the bytes the node holds
//     (larder_node_bytes), which is exact only when every template's
//     entries live as long as the others';
//   - invalidation messages the nodes applied, for all templates: the
//     nodes do not attribute invalidations to templates (a template's
//     staleness misses are what invalidations cost it).
//
// Both the cache-node and the client label at most 500 templates; later
// ones are counted under "other", and the report says when the template
// may be among them. An endpoint that cannot be read is reported with its
// error; the others' figures still count.
//
// # Thread safety
//
// Reports are plain values; Statement and Scrape may be called
// concurrently.
package explain
