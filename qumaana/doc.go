// Command qumaana is the QUMA template analyzer's CLI: from a schema (a DDL
// file or a live database) and a workload (a file of SQL templates, a
// PostgreSQL server log with log_statement=all, or a pg_stat_statements
// export) it writes the QUMA solution — as a text report or as the JSON file
// that client-lib and the invalidator load.
//
//	go run ./qumaana analyze --schema schema.sql --templates app.sql --format json -o quma.json
//	go run ./qumaana analyze --db postgres://... --log postgresql.log
//
// The analysis itself is package qumaana/quma.
package main
