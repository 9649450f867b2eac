package servers

import (
	"errors"
	"fmt"
)

// ErrNotReady is returned when a started server did not accept connections in time.
var ErrNotReady = errors.New("larder/servers: server did not become ready")

// MissingBinaryError reports a server binary that could not be found, with the
// command that installs it.
type MissingBinaryError struct {
	Name   string   // binary that was looked for, e.g. "initdb"
	Looked []string // places searched
	Hint   string   // how to install it
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("larder/servers: %s not found (looked in %v); install it: %s", e.Name, e.Looked, e.Hint)
}

// IsMissingBinary reports whether err (or an error it wraps) is a *MissingBinaryError.
func IsMissingBinary(err error) bool {
	var m *MissingBinaryError
	return errors.As(err, &m)
}
