package quma

import (
	"errors"
	"fmt"

	"github.com/pganalyze/pg_query_go/v6/parser"
)

// ErrEmpty is returned for SQL text with no statement in it.
var ErrEmpty = errors.New("quma: no statement")

// SyntaxError is a statement PostgreSQL's parser rejected.
type SyntaxError struct {
	Message string
	Line    int // 1-based; 0 when unknown
	Column  int // 1-based; 0 when unknown
	Offset  int // 0-based byte offset; -1 when unknown
}

func (e *SyntaxError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("quma: syntax error at line %d, column %d: %s", e.Line, e.Column, e.Message)
	}
	return "quma: syntax error: " + e.Message
}

// newSyntaxError converts pg_query's error, locating it in sql.
func newSyntaxError(sql string, err error) error {
	var pe *parser.Error
	if !errors.As(err, &pe) {
		return &SyntaxError{Message: err.Error(), Offset: -1}
	}
	se := &SyntaxError{Message: pe.Message, Offset: -1}
	if pe.Cursorpos > 0 { // counts characters from 1
		se.Offset = ddlRuneOffset(sql, pe.Cursorpos-1)
		se.Line, se.Column = ddlLineCol(sql, se.Offset)
	}
	return se
}

// ParamError reports a parameter value that cannot be used.
type ParamError struct {
	Param  int // 1-based
	Reason string
}

func (e *ParamError) Error() string { return fmt.Sprintf("quma: parameter $%d: %s", e.Param, e.Reason) }
