package recipe

import "errors"

// Errors wrapped by everything this package returns; branch on them with
// errors.Is.
var (
	// ErrVersion: a message's first byte is a format version this package
	// does not read.
	ErrVersion = errors.New("recipe: unknown format version")
	// ErrKind: a message is not of the kind the parser was asked for (a
	// fill handed to ParseRecipe).
	ErrKind = errors.New("recipe: unexpected message kind")
	// ErrCorrupt: a message is malformed (truncated, trailing bytes, a
	// count that cannot fit, an unknown flag).
	ErrCorrupt = errors.New("recipe: corrupt message")
	// ErrTooLarge: a message or the result it rebuilds exceeds the
	// receiver's Limits.
	ErrTooLarge = errors.New("recipe: over the receiver's limits")
	// ErrMismatch: a result rebuilt from rows the origin sent verbatim does
	// not match the whole-result hash the origin sent with it, so no
	// refetch can help.
	ErrMismatch = errors.New("recipe: whole-result hash mismatch")
	// ErrUnresolved: a recipe could still not be rebuilt after the
	// refetches the decoder allows.
	ErrUnresolved = errors.New("recipe: result could not be rebuilt")
	// ErrUnknownRow: a refetch asked the origin for a row that is not in
	// the result it answers for.
	ErrUnknownRow = errors.New("recipe: row is not in the result")
	// ErrConfig: a Config or Limits value is out of range.
	ErrConfig = errors.New("recipe: invalid configuration")
)
