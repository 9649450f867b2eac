// Command qumaana is the QUMA template analyzer's CLI. analyze reads a
// schema (a DDL file or a live database) and a workload (a file of SQL
// templates, a PostgreSQL server log with log_statement=all, or a
// pg_stat_statements export) and writes the QUMA solution — as a text
// report or as the JSON file that client-lib and the invalidator load.
// explain says what Larder does with one statement — cacheable or why not,
// clock-bound, its template id, tags, tag column sets and columns read —
// and, given metrics endpoints, its template's live figures.
//
//	go run ./qumaana analyze --schema schema.sql --templates app.sql --format json -o quma.json
//	go run ./qumaana analyze --db postgres://... --log postgresql.log
//	go run ./qumaana explain --quma quma.json --metrics 127.0.0.1:9189 'SELECT * FROM items WHERE id = $1'
//
// The analysis itself is package qumaana/quma; the explanation, package
// qumaana/explain.
package main
