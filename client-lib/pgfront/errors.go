package pgfront

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	larder "github.com/larderdb/larder/client-lib"
)

// ErrClosed is returned by Run on a Front closed before it ran.
var ErrClosed = errors.New("pgfront: front closed")

// SQLSTATEs the front answers with itself.
const (
	codeSerializationFailure = "40001" // a Larder transaction must be retried
	codeFeatureNotSupported  = "0A000"
	codeProtocolViolation    = "08P01"
	codeInFailedTransaction  = "25P02"
	codeActiveTransaction    = "25001"
	codeReadOnlyTransaction  = "25006"
	codeInvalidParameter     = "22023"
	codeUndefinedStatement   = "26000"
	codeUndefinedPortal      = "34000"
	codeDuplicateStatement   = "42P05"
	codeDuplicatePortal      = "42P03"
	codeQueryCanceled        = "57014"
	codeInternal             = "XX000"
	codeConnectionFailure    = "08006"
)

// frontError is an error the front answers a client with.
type frontError struct {
	severity, code, message, detail, hint string
}

func (e *frontError) Error() string { return e.code + ": " + e.message }

func errorf(code, format string, args ...any) *frontError {
	return &frontError{severity: "ERROR", code: code, message: fmt.Sprintf(format, args...)}
}

// inFailedTransaction is PostgreSQL's answer to a statement after an
// error in a transaction block.
func inFailedTransaction() *frontError {
	return errorf(codeInFailedTransaction, "current transaction is aborted, commands ignored until end of transaction block")
}

// errorResponse is the message that answers err: PostgreSQL's own error
// with every field it sent, 40001 for a transaction the library cannot
// continue at one snapshot (the client retries it), the front's own, or
// an internal error.
func errorResponse(err error) *pgproto3.ErrorResponse {
	var fe *frontError
	if errors.As(err, &fe) {
		return &pgproto3.ErrorResponse{Severity: fe.severity, SeverityUnlocalized: fe.severity, Code: fe.code,
			Message: fe.message, Detail: fe.detail, Hint: fe.hint}
	}
	if pe, ok := larder.PgError(err); ok {
		return &pgproto3.ErrorResponse{
			Severity: pe.Severity, SeverityUnlocalized: pe.SeverityUnlocalized, Code: pe.Code, Message: pe.Message,
			Detail: pe.Detail, Hint: pe.Hint, Position: pe.Position, InternalPosition: pe.InternalPosition,
			InternalQuery: pe.InternalQuery, Where: pe.Where, SchemaName: pe.SchemaName, TableName: pe.TableName,
			ColumnName: pe.ColumnName, DataTypeName: pe.DataTypeName, ConstraintName: pe.ConstraintName,
			File: pe.File, Line: pe.Line, Routine: pe.Routine,
		}
	}
	if errors.Is(err, larder.ErrRetry) {
		return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: codeSerializationFailure,
			Message: "could not serialize access: " + err.Error(), Hint: "Run the transaction again."}
	}
	if errors.Is(err, context.Canceled) {
		return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: codeQueryCanceled,
			Message: "canceling statement: the front is shutting down"}
	}
	return &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: codeInternal, Message: err.Error()}
}

// fatal is a FATAL error that ends a session.
func fatal(code, format string, args ...any) *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: fmt.Sprintf(format, args...)}
}

// quoted is a name as PostgreSQL's messages quote it.
func quoted(name string) string { return `"` + name + `"` }
