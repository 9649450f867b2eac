package larder

import (
	"context"
	"database/sql"
)

// SQLFunction is a cacheable function for database/sql code: its body
// queries through the *sql.Tx of a read-only transaction begun on a
// *sql.Conn of the larder driver, and those queries go through that
// transaction's Larder read-only transaction, so the function's entry
// follows the same rules as a Function's (see Function).
type SQLFunction[A, R any] struct {
	name string
	fn   func(ctx context.Context, tx *sql.Tx, arg A) (R, error)
}

// NewSQLFunction names a cacheable function whose body uses database/sql.
func NewSQLFunction[A, R any](name string, fn func(ctx context.Context, tx *sql.Tx, arg A) (R, error)) *SQLFunction[A, R] {
	return &SQLFunction[A, R]{name: name, fn: fn}
}

// Call returns the function's result for arg as of the snapshot of tx, a
// read-only transaction begun on conn (conn.BeginTx with ReadOnly). On a
// connection of another driver, or outside a read-only transaction, the
// body runs uncached.
func (f *SQLFunction[A, R]) Call(ctx context.Context, conn *sql.Conn, tx *sql.Tx, arg A) (R, error) {
	ro := readOnlyTxOf(conn)
	if ro == nil {
		return f.fn(ctx, tx, arg)
	}
	inner := Function[A, R]{name: f.name, fn: func(ctx context.Context, _ *ROTx, a A) (R, error) { return f.fn(ctx, tx, a) }}
	return inner.Call(ctx, ro, arg)
}

// readOnlyTxOf returns the Larder read-only transaction open on a
// database/sql connection of the larder driver (nil: none).
func readOnlyTxOf(c *sql.Conn) *ROTx {
	if c == nil {
		return nil
	}
	var ro *ROTx
	_ = c.Raw(func(dc any) error {
		if lc, ok := dc.(*conn); ok {
			ro = lc.ro
		}
		return nil
	})
	return ro
}
