package larder

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is an error of a Larder operation. It wraps the cause — often a
// *pgconn.PgError from PostgreSQL — so errors.As and errors.Is see it.
type Error struct {
	Op  string // "begin", "query", "snapshot", "commit"
	SQL string // the statement, for query errors
	Err error
}

func (e *Error) Error() string {
	if e.SQL != "" {
		return fmt.Sprintf("larder: %s %q: %v", e.Op, e.SQL, e.Err)
	}
	return fmt.Sprintf("larder: %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// PgError returns the PostgreSQL error behind err, if there is one.
func PgError(err error) (*pgconn.PgError, bool) {
	var pe *pgconn.PgError
	ok := errors.As(err, &pe)
	return pe, ok
}

func wrap(op, sql string, err error) error {
	if err == nil {
		return nil
	}
	var le *Error
	if errors.As(err, &le) || errors.Is(err, ErrRetry) {
		return err
	}
	return &Error{Op: op, SQL: sql, Err: err}
}
