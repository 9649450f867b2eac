// Package app is RUBiS, the auction site, in Go: the 27 interactions of
// the specification (../../../../shared/rubis/README.md) over
// database/sql, so that the same code runs on the plain pgx driver
// ("direct") and on Larder's driver. Browsing pages run in read-only
// transactions, writes in read/write ones. Reads that compare with the
// current time take it as a parameter rounded to a granularity (60 s by
// default); UseSQLNow runs the original now() form.
package app
