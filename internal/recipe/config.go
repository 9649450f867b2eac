package recipe

import "fmt"

// RowOverhead is what a held row costs on top of its bytes when it is
// charged against a Config's MaxBytes: about what the edge's RowStore
// spends per row on its index, its full hash and the slice header. Both
// sides charge the same, so the origin's model evicts what the edge does.
const RowOverhead = 96

// MinStoredRow is the length under which a row is never held nor
// referenced: a reference (RefSize bytes) would save almost nothing and
// the row would still cost a slot on both sides. Such rows always travel
// verbatim.
const MinStoredRow = 32

// Charge is what a row of n bytes costs against Config.MaxBytes.
func Charge(n int) int64 { return int64(n) + RowOverhead }

// Config is the edge row store's budget. The origin's Tracker for that
// edge must be given the same Config: it simulates the edge's eviction
// with it, and any difference only costs refetches.
type Config struct {
	// MaxBytes bounds the sum of Charge(len(row)) over the rows held.
	// A row whose charge alone exceeds it is never held. Zero holds
	// nothing: every row travels verbatim (the whole-result hash is still
	// sent and checked), the "no recipes" baseline.
	MaxBytes int64
	// MaxRows bounds the number of rows held. It also bounds the
	// origin's memory for the edge: a Tracker keeps about 80 bytes per
	// row whatever the rows' sizes.
	MaxRows int
}

// maxRowsLimit keeps slot numbers within int32.
const maxRowsLimit = 1 << 30

// DefaultConfig returns a budget of 256 MiB and 1 Mi rows: about a
// quarter of a GiB per edge on the edge, about 80 MiB per edge at most on
// the origin, and room for one SelectSort-sized result (280 K rows of
// 800 bytes, ~250 MiB charged).
func DefaultConfig() Config {
	return Config{MaxBytes: 256 << 20, MaxRows: 1 << 20}
}

// Validate reports a budget that cannot hold a row (other than zero,
// which holds none on purpose).
func (c Config) Validate() error {
	if c.MaxBytes != 0 && c.MaxBytes < Charge(MinStoredRow) {
		return fmt.Errorf("%w: MaxBytes %d is neither 0 nor at least one row's charge (%d)", ErrConfig, c.MaxBytes, Charge(MinStoredRow))
	}
	if c.MaxRows < 1 || c.MaxRows > maxRowsLimit {
		return fmt.Errorf("%w: MaxRows %d is not in [1, %d]", ErrConfig, c.MaxRows, maxRowsLimit)
	}
	return nil
}

// storable reports whether a row of n bytes is held (and so may be
// referenced) under c. Encoder and store use this one predicate.
func (c Config) storable(n int) bool {
	return n >= MinStoredRow && Charge(n) <= c.MaxBytes
}

// Limits bound what a receiver accepts from one message, so that a
// corrupt or hostile message cannot make it allocate without bound.
type Limits struct {
	// MaxRows bounds the rows of one result (and of one fill or refetch
	// request).
	MaxRows int
	// MaxResultBytes bounds a rebuilt result: header plus rows. References
	// let a small recipe name a large result; this is checked before the
	// result is assembled.
	MaxResultBytes int64
}

// DefaultLimits returns 16 Mi rows and 1 GiB, well above one SelectSort
// result (280 K rows, ~220 MB).
func DefaultLimits() Limits {
	return Limits{MaxRows: 1 << 24, MaxResultBytes: 1 << 30}
}

// Validate reports limits that accept nothing.
func (l Limits) Validate() error {
	if l.MaxRows < 0 || l.MaxRows > maxRowsLimit {
		return fmt.Errorf("%w: Limits.MaxRows %d is not in [0, %d]", ErrConfig, l.MaxRows, maxRowsLimit)
	}
	if l.MaxResultBytes < 0 {
		return fmt.Errorf("%w: Limits.MaxResultBytes %d is negative", ErrConfig, l.MaxResultBytes)
	}
	return nil
}
