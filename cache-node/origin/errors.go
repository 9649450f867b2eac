package origin

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinels the edge branches on. A Backend wraps them in what it returns;
// the origin sends their kind, and the edge's errors wrap them again.
var (
	// ErrRetry: the edge transaction cannot go on at its pin; the caller
	// retries the transaction (larder.ErrRetry at the edge).
	ErrRetry = errors.New("origin: retry the transaction")
	// ErrRewritten: a table the transaction reads was truncated or
	// rewritten after its pin (the edge drops the pins that old). It
	// wraps ErrRetry.
	ErrRewritten = fmt.Errorf("origin: a table was rewritten after the pin: %w", ErrRetry)
	// ErrScope: the origin's PostgreSQL session would read as another
	// role or with other settings than the edge's; the edge runs the
	// transaction on its own connection instead.
	ErrScope = errors.New("origin: the origin's session scope differs from the edge's")
	// ErrBusy: the origin holds as many sessions as it may.
	ErrBusy = errors.New("origin: too many sessions")
	// ErrProtocol marks a malformed or unexpected message.
	ErrProtocol = errors.New("origin: protocol error")
	// ErrArgs: a statement's arguments have a type the protocol does not
	// carry.
	ErrArgs = errors.New("origin: argument type not supported")
)

// Error kinds on the wire (the first byte of an error frame).
const (
	kindOther     = 0
	kindPostgres  = 1 // Code is the SQLSTATE
	kindRetry     = 2
	kindRewritten = 3
	kindScope     = 4
	kindBusy      = 5
	kindArgs      = 6
)

// RemoteError is an error the origin reported. It unwraps to the sentinel
// of its kind, or to a *pgconn.PgError carrying PostgreSQL's SQLSTATE, so
// that errors.Is and errors.As work at the edge as at the origin.
type RemoteError struct {
	Kind    byte
	Code    string // SQLSTATE for a PostgreSQL error
	Message string
}

func (e *RemoteError) Error() string { return "origin: " + e.Message }

// Postgres reports an error PostgreSQL raised at the origin.
func (e *RemoteError) Postgres() bool { return e.Kind == kindPostgres }

// Unwrap returns the sentinel or PostgreSQL error the kind stands for.
func (e *RemoteError) Unwrap() error {
	switch e.Kind {
	case kindPostgres:
		return &pgconn.PgError{Severity: "ERROR", Code: e.Code, Message: e.Message}
	case kindRetry:
		return ErrRetry
	case kindRewritten:
		return ErrRewritten
	case kindScope:
		return ErrScope
	case kindBusy:
		return ErrBusy
	case kindArgs:
		return ErrArgs
	}
	return nil
}

// classify turns an error into what an error frame carries.
func classify(err error) RemoteError {
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, ErrRewritten):
		return RemoteError{Kind: kindRewritten, Message: err.Error()}
	case errors.Is(err, ErrRetry):
		return RemoteError{Kind: kindRetry, Message: err.Error()}
	case errors.Is(err, ErrScope):
		return RemoteError{Kind: kindScope, Message: err.Error()}
	case errors.Is(err, ErrBusy):
		return RemoteError{Kind: kindBusy, Message: err.Error()}
	case errors.Is(err, ErrArgs):
		return RemoteError{Kind: kindArgs, Message: err.Error()}
	case errors.As(err, &pe):
		return RemoteError{Kind: kindPostgres, Code: pe.Code, Message: pe.Message}
	}
	return RemoteError{Kind: kindOther, Message: err.Error()}
}
