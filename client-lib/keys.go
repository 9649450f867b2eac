package larder

import (
	"crypto/sha256"
	"database/sql/driver"
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"
)

// errUnkeyable marks an argument whose value cannot be named exactly
// (a struct, a channel, a cyclic value): the query is then not cached.
var errUnkeyable = errors.New("larder: argument cannot be keyed")

// maxKeyDepth bounds how deep appendKeyArg follows pointers, Valuers and
// nested slices.
const maxKeyDepth = 16

// key names a query's result exactly: the key scope (role, settings that
// change results), the SQL text as sent (literals included) and every
// argument in a canonical, type-tagged, length-prefixed form. Two keys are
// equal only when PostgreSQL receives the same statement with the same
// inputs in the same session state.
func (c *Client) key(scope, sql string, args []any) ([]byte, error) {
	buf := make([]byte, 0, 64+len(scope)+len(sql)+16*len(args))
	buf = append(buf, "larder-key-v2"...)
	buf = appendLenPrefixed(buf, []byte(scope))
	buf = appendLenPrefixed(buf, []byte(sql))
	buf = binary.AppendUvarint(buf, uint64(len(args)))
	for _, a := range args {
		var err error
		if buf, err = appendKeyArg(buf, a, 0); err != nil {
			return nil, err
		}
	}
	sum := sha256.Sum256(buf)
	return sum[:], nil
}

func appendLenPrefixed(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// appendKeyArg appends one argument: a tag naming its Go type (so values
// of different types never collide, whatever PostgreSQL infers from them)
// and its content. Pointers are followed (the value counts, never the
// address); a driver.Valuer counts by what it gives PostgreSQL; time.Time
// by its wall clock and offset (never its monotonic reading); anything
// else that has no exact canonical form is refused.
func appendKeyArg(dst []byte, a any, depth int) ([]byte, error) {
	if depth > maxKeyDepth {
		return nil, fmt.Errorf("%w: nested more than %d deep", errUnkeyable, maxKeyDepth)
	}
	if a == nil {
		return append(dst, 'N'), nil
	}
	rv := reflect.ValueOf(a)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return append(dst, 'N'), nil
		}
		// A pointer type may implement driver.Valuer itself (pgtype's
		// types on pointer receivers): ask it first, as pgx does.
		if v, ok := a.(driver.Valuer); ok {
			return appendValuer(dst, a, v, depth)
		}
		return appendKeyArg(dst, rv.Elem().Interface(), depth+1)
	}
	dst = appendLenPrefixed(append(dst, 'T'), []byte(typeName(rv.Type())))
	switch x := a.(type) {
	case time.Time:
		return appendLenPrefixed(append(dst, 't'), []byte(x.Format(time.RFC3339Nano))), nil
	case []byte:
		return appendLenPrefixed(append(dst, 'b'), x), nil
	case string:
		return appendLenPrefixed(append(dst, 's'), []byte(x)), nil
	case driver.Valuer:
		return appendValuer(dst, a, x, depth)
	}
	switch rv.Kind() {
	case reflect.Bool:
		if rv.Bool() {
			return append(dst, 'B', 1), nil
		}
		return append(dst, 'B', 0), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return binary.AppendVarint(append(dst, 'i'), rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return binary.AppendUvarint(append(dst, 'u'), rv.Uint()), nil
	case reflect.Float32, reflect.Float64:
		return binary.BigEndian.AppendUint64(append(dst, 'f'), math.Float64bits(rv.Float())), nil
	case reflect.String:
		return appendLenPrefixed(append(dst, 's'), []byte(rv.String())), nil
	}
	if tm, ok := a.(encoding.TextMarshaler); ok {
		text, err := tm.MarshalText()
		if err != nil {
			return nil, fmt.Errorf("%w: %T: %v", errUnkeyable, a, err)
		}
		return appendLenPrefixed(append(dst, 'x'), text), nil
	}
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return append(dst, 'N'), nil
		}
		dst = binary.AppendUvarint(append(dst, 'a'), uint64(rv.Len()))
		for i := 0; i < rv.Len(); i++ {
			var err error
			if dst, err = appendKeyArg(dst, rv.Index(i).Interface(), depth+1); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	return nil, fmt.Errorf("%w: a %T has no canonical form", errUnkeyable, a)
}

func appendValuer(dst []byte, a any, v driver.Valuer, depth int) ([]byte, error) {
	val, err := v.Value()
	if err != nil {
		return nil, fmt.Errorf("%w: %T.Value: %v", errUnkeyable, a, err)
	}
	if val != nil {
		if inner, ok := val.(driver.Valuer); ok && reflect.TypeOf(inner) == reflect.TypeOf(a) {
			return nil, fmt.Errorf("%w: %T.Value returns itself", errUnkeyable, a)
		}
	}
	return appendKeyArg(append(dst, 'v'), val, depth+1)
}

// typeName names a type with its package path, so that two packages'
// types of one name differ.
func typeName(t reflect.Type) string {
	if t.PkgPath() != "" {
		return t.PkgPath() + "." + t.Name()
	}
	return t.String()
}

// DefaultClockGranularity is the default width of clock buckets: a
// clock-bound query (now(), CURRENT_DATE, … ; see quma.Template.ClockSQL)
// sees "now" as its transaction's start rounded down to it.
const DefaultClockGranularity = time.Minute

// clockGranularity is the clock bucket width of a template (its
// Config.ClockGranularities entry, else Config.ClockGranularity, else the
// default); <= 0: clock-bound queries of it are not cached.
func (c *Client) clockGranularity(templateID string) time.Duration {
	if g, ok := c.cfg.ClockGranularities[templateID]; ok {
		return g
	}
	if c.cfg.ClockGranularity != 0 {
		return c.cfg.ClockGranularity
	}
	return DefaultClockGranularity
}

// clockBucket is begun rounded down to a multiple of g since the Unix
// epoch, in UTC: the same instant for every process and time zone.
func clockBucket(begun time.Time, g time.Duration) time.Time {
	ns := begun.UnixNano()
	return time.Unix(0, ns-((ns%int64(g))+int64(g))%int64(g)).UTC()
}
