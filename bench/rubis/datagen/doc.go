// Package datagen loads a RUBiS database: the schema of the specification
// (../../../../shared/rubis/README.md, "Schema"), deterministic data from a
// seed at a chosen size, loaded with PostgreSQL's COPY, then the
// specification's indexes. Item dates are relative to the load time, so
// searches for open auctions find items.
package datagen
