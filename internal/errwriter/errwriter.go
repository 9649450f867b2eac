// Package errwriter writes text reports: a Writer keeps the first write
// error, so that a report is written without checking every line, and
// its error read once at the end.
package errwriter

import (
	"fmt"
	"io"
)

// Writer writes to W until a write fails; later writes do nothing and
// return that error.
type Writer struct {
	W   io.Writer
	err error
}

// New returns a Writer on w.
func New(w io.Writer) *Writer { return &Writer{W: w} }

// Write implements io.Writer.
func (e *Writer) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.W.Write(p)
	e.err = err
	return n, err
}

// Printf writes a formatted line part.
func (e *Writer) Printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

// Err is the first write error (nil if none).
func (e *Writer) Err() error { return e.err }
