package origin

import (
	"database/sql/driver"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/larderdb/larder/internal/wire"
)

// ProtoVersion is the version of the origin protocol's messages, agreed in
// the hello (the frames are the cache-node protocol's, whose own version
// byte is in every frame). README.md beside this file describes version 1.
const ProtoVersion = 1

// Requests (edge → origin) and answers (origin → edge), the op byte of a
// frame.
const (
	OpHello   = 'H' // edge id, the edge's row-store budget, reset flag → OpOK
	OpBegin   = 'B' // begin at a pin, holding tables → OpOK
	OpHold    = 'L' // hold more tables → OpOK
	OpQuery   = 'X' // run a statement → OpRecipe
	OpRefetch = 'Q' // rows of the last result (recipe.Refetch) → OpFill or OpRecipe (verbatim)
	OpEnd     = 'N' // end the session's transaction → OpOK
	OpOK      = 'K'
	OpRecipe  = 'R' // a recipe message (internal/recipe)
	OpFill    = 'F' // a fill message (internal/recipe)
	OpError   = 'E' // kind, SQLSTATE, message
)

// Hello opens a connection: which edge speaks, and its row store's budget
// (a recipe reset message, recipe.AppendReset). Reset asks the origin to
// forget what it believed the edge held.
type Hello struct {
	Version uint64
	EdgeID  string
	Reset   bool
	Budget  []byte // recipe.AppendReset
}

const helloReset = 1

// AppendHello encodes h.
func AppendHello(dst []byte, h *Hello) []byte {
	dst = binary.AppendUvarint(dst, h.Version)
	dst = wire.AppendString(dst, h.EdgeID)
	var f byte
	if h.Reset {
		f |= helloReset
	}
	dst = append(dst, f)
	return wire.AppendBytes(dst, h.Budget)
}

// DecodeHello decodes a hello.
func DecodeHello(b []byte) (Hello, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	h := Hello{Version: d.Uvarint("version"), EdgeID: d.String("edge id")}
	f := d.Byte("flags")
	if f&^helloReset != 0 {
		d.Fail("unknown hello flags %#x", f)
	}
	h.Reset = f&helloReset != 0
	h.Budget = d.Bytes("budget")
	return h, d.End()
}

// Begin opens a session's transaction at a pin.
type Begin struct {
	Snapshot string // the pin's exported snapshot
	TS       uint64 // the pin's commit LSN
	// ServerStart is the start time of the PostgreSQL server that exported
	// the snapshot (zero: unknown). Snapshot ids repeat across server
	// restarts: the origin refuses the pin as released when its own
	// connection's server started at another time.
	ServerStart time.Time
	// SQLFormats: results in the formats database/sql's driver asks for.
	SQLFormats bool
	// Scope is the edge's session scope key: the origin refuses (ErrScope)
	// when its own differs, so that no result is read as another role.
	Scope  string
	Tables []string
}

// Begin flags. A begin without a server start is the same bytes as
// before the flag existed; an origin that does not know the flag refuses
// a begin carrying it (unknown flags) rather than import the pin unchecked.
const (
	beginSQLFormats  = 1
	beginServerStart = 2 // a varint server start (Unix ns, non-zero) follows the flags
)

// AppendBegin encodes b.
func AppendBegin(dst []byte, b *Begin) []byte {
	dst = wire.AppendString(dst, b.Snapshot)
	dst = binary.AppendUvarint(dst, b.TS)
	var f byte
	if b.SQLFormats {
		f |= beginSQLFormats
	}
	start := serverStartNanos(b.ServerStart)
	if start != 0 {
		f |= beginServerStart
	}
	dst = append(dst, f)
	if start != 0 {
		dst = binary.AppendVarint(dst, start)
	}
	dst = wire.AppendString(dst, b.Scope)
	return AppendTables(dst, b.Tables)
}

// serverStartNanos is t in Unix nanoseconds, 0 for the zero time.
func serverStartNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// DecodeBegin decodes a begin.
func DecodeBegin(b []byte) (Begin, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	r := Begin{Snapshot: d.String("snapshot"), TS: d.Uvarint("ts")}
	f := d.Byte("flags")
	if f&^(beginSQLFormats|beginServerStart) != 0 {
		d.Fail("unknown begin flags %#x", f)
	}
	r.SQLFormats = f&beginSQLFormats != 0
	if f&beginServerStart != 0 {
		switch ns := d.Varint("server start"); {
		case d.Err != nil:
		case ns == 0:
			d.Fail("server start flag without a server start")
		default:
			r.ServerStart = time.Unix(0, ns).UTC()
		}
	}
	r.Scope = d.String("scope")
	r.Tables = tables(&d)
	return r, d.End()
}

// AppendTables encodes a list of table names (a hold).
func AppendTables(dst []byte, ts []string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ts)))
	for _, t := range ts {
		dst = wire.AppendString(dst, t)
	}
	return dst
}

// DecodeTables decodes a hold's table names.
func DecodeTables(b []byte) ([]string, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	ts := tables(&d)
	return ts, d.End()
}

func tables(d *wire.Decoder) []string {
	n := d.Count("tables", 1)
	var ts []string
	for i := 0; i < n && d.Err == nil; i++ {
		ts = append(ts, d.String("table"))
	}
	return ts
}

// Query is a statement and its arguments.
type Query struct {
	SQL  string
	Args []any
}

// AppendQuery encodes q; arguments of a type the protocol does not carry
// are an error wrapping ErrArgs.
func AppendQuery(dst []byte, q *Query) ([]byte, error) {
	dst = wire.AppendString(dst, q.SQL)
	return AppendArgs(dst, q.Args)
}

// DecodeQuery decodes a query.
func DecodeQuery(b []byte) (Query, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	q := Query{SQL: d.String("sql")}
	q.Args = args(&d)
	return q, d.End()
}

// Argument tags.
const (
	argNil = iota
	argFalse
	argTrue
	argInt
	argUint
	argFloat64
	argString
	argBytes
	argTime
	argInts
	argStrings
	argFloat32
	argFloats
	argBools
	argByteses
	argUUID
)

// AppendArgs encodes statement arguments: nil, bool, the integer and
// float kinds, string, []byte, time.Time, []int64/[]int32/[]int/[]string,
// []float64/[]float32, []bool, [][]byte (for = ANY($n)), [16]byte (a
// UUID), driver.Valuer (by its value), pointers to any of these (nil: a
// NULL) and named types whose kind is one of the scalar ones (by that
// kind). The origin passes them
// to pgx as the same Go values (integers as int64), so they encode to the
// same parameters.
func AppendArgs(dst []byte, as []any) ([]byte, error) {
	dst = binary.AppendUvarint(dst, uint64(len(as)))
	for i, a := range as {
		var err error
		if dst, err = appendArg(dst, a, 0); err != nil {
			return dst, fmt.Errorf("argument $%d: %w", i+1, err)
		}
	}
	return dst, nil
}

func appendArg(dst []byte, a any, depth int) ([]byte, error) {
	switch v := a.(type) {
	case nil:
		return append(dst, argNil), nil
	case bool:
		if v {
			return append(dst, argTrue), nil
		}
		return append(dst, argFalse), nil
	case int:
		return binary.AppendVarint(append(dst, argInt), int64(v)), nil
	case int8:
		return binary.AppendVarint(append(dst, argInt), int64(v)), nil
	case int16:
		return binary.AppendVarint(append(dst, argInt), int64(v)), nil
	case int32:
		return binary.AppendVarint(append(dst, argInt), int64(v)), nil
	case int64:
		return binary.AppendVarint(append(dst, argInt), v), nil
	case uint8:
		return binary.AppendUvarint(append(dst, argUint), uint64(v)), nil
	case uint16:
		return binary.AppendUvarint(append(dst, argUint), uint64(v)), nil
	case uint32:
		return binary.AppendUvarint(append(dst, argUint), uint64(v)), nil
	case uint64:
		return binary.AppendUvarint(append(dst, argUint), v), nil
	case uint:
		return binary.AppendUvarint(append(dst, argUint), uint64(v)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(dst, argFloat64), math.Float64bits(v)), nil
	case float32:
		return binary.BigEndian.AppendUint32(append(dst, argFloat32), math.Float32bits(v)), nil
	case string:
		return wire.AppendString(append(dst, argString), v), nil
	case []byte:
		if v == nil {
			return append(dst, argNil), nil
		}
		return wire.AppendBytes(append(dst, argBytes), v), nil
	case time.Time:
		return wire.AppendString(append(dst, argTime), v.Format(time.RFC3339Nano)), nil
	case []int64:
		dst = binary.AppendUvarint(append(dst, argInts), uint64(len(v)))
		for _, x := range v {
			dst = binary.AppendVarint(dst, x)
		}
		return dst, nil
	case []int32:
		dst = binary.AppendUvarint(append(dst, argInts), uint64(len(v)))
		for _, x := range v {
			dst = binary.AppendVarint(dst, int64(x))
		}
		return dst, nil
	case []int:
		dst = binary.AppendUvarint(append(dst, argInts), uint64(len(v)))
		for _, x := range v {
			dst = binary.AppendVarint(dst, int64(x))
		}
		return dst, nil
	case []string:
		dst = binary.AppendUvarint(append(dst, argStrings), uint64(len(v)))
		for _, x := range v {
			dst = wire.AppendString(dst, x)
		}
		return dst, nil
	case []float64:
		dst = binary.AppendUvarint(append(dst, argFloats), uint64(len(v)))
		for _, x := range v {
			dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(x))
		}
		return dst, nil
	case []float32:
		// Exact: every float32 is a float64.
		dst = binary.AppendUvarint(append(dst, argFloats), uint64(len(v)))
		for _, x := range v {
			dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(float64(x)))
		}
		return dst, nil
	case []bool:
		dst = binary.AppendUvarint(append(dst, argBools), uint64(len(v)))
		for _, x := range v {
			b := byte(0)
			if x {
				b = 1
			}
			dst = append(dst, b)
		}
		return dst, nil
	case [][]byte:
		dst = binary.AppendUvarint(append(dst, argByteses), uint64(len(v)))
		for _, x := range v {
			dst = wire.AppendBytes(dst, x)
		}
		return dst, nil
	case [16]byte:
		return append(append(dst, argUUID), v[:]...), nil
	case driver.Valuer:
		if depth > 0 {
			break
		}
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
			return append(dst, argNil), nil // as database/sql does
		}
		val, err := v.Value()
		if err != nil {
			return dst, err
		}
		return appendArg(dst, val, depth+1)
	}
	if depth < 4 {
		// A pointer (NULL when nil), or a named type of a scalar kind.
		rv := reflect.ValueOf(a)
		switch rv.Kind() {
		case reflect.Pointer:
			if rv.IsNil() {
				return append(dst, argNil), nil
			}
			return appendArg(dst, rv.Elem().Interface(), depth+1)
		case reflect.Bool:
			return appendArg(dst, rv.Bool(), depth+1)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			return appendArg(dst, rv.Int(), depth+1)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			return appendArg(dst, rv.Uint(), depth+1)
		case reflect.Float32:
			return appendArg(dst, float32(rv.Float()), depth+1)
		case reflect.Float64:
			return appendArg(dst, rv.Float(), depth+1)
		case reflect.String:
			return appendArg(dst, rv.String(), depth+1)
		}
	}
	return dst, fmt.Errorf("%w: %T", ErrArgs, a)
}

func args(d *wire.Decoder) []any {
	n := d.Count("arguments", 1)
	as := make([]any, 0, n)
	for i := 0; i < n && d.Err == nil; i++ {
		switch tag := d.Byte("argument tag"); tag {
		case argNil:
			as = append(as, nil)
		case argFalse, argTrue:
			as = append(as, tag == argTrue)
		case argInt:
			as = append(as, d.Varint("integer"))
		case argUint:
			as = append(as, d.Uvarint("integer"))
		case argFloat64:
			if b := fixed(d, 8); b != nil {
				as = append(as, math.Float64frombits(binary.BigEndian.Uint64(b)))
			}
		case argFloat32:
			if b := fixed(d, 4); b != nil {
				as = append(as, math.Float32frombits(binary.BigEndian.Uint32(b)))
			}
		case argString:
			as = append(as, d.String("string"))
		case argBytes:
			as = append(as, append([]byte{}, d.Bytes("bytes")...))
		case argTime:
			s := d.String("time")
			if d.Err == nil {
				t, err := time.Parse(time.RFC3339Nano, s)
				if err != nil {
					d.Fail("time %q: %v", s, err)
				}
				as = append(as, t)
			}
		case argInts:
			m := d.Count("integers", 1)
			xs := make([]int64, 0, m)
			for j := 0; j < m && d.Err == nil; j++ {
				xs = append(xs, d.Varint("integer"))
			}
			as = append(as, xs)
		case argStrings:
			m := d.Count("strings", 1)
			xs := make([]string, 0, m)
			for j := 0; j < m && d.Err == nil; j++ {
				xs = append(xs, d.String("string"))
			}
			as = append(as, xs)
		case argFloats:
			m := d.Count("floats", 8)
			xs := make([]float64, 0, m)
			for j := 0; j < m && d.Err == nil; j++ {
				if b := fixed(d, 8); b != nil {
					xs = append(xs, math.Float64frombits(binary.BigEndian.Uint64(b)))
				}
			}
			as = append(as, xs)
		case argBools:
			m := d.Count("booleans", 1)
			xs := make([]bool, 0, m)
			for j := 0; j < m && d.Err == nil; j++ {
				switch b := d.Byte("boolean"); b {
				case 0, 1:
					xs = append(xs, b == 1)
				default:
					d.Fail("boolean %d", b)
				}
			}
			as = append(as, xs)
		case argByteses:
			m := d.Count("byte strings", 1)
			xs := make([][]byte, 0, m)
			for j := 0; j < m && d.Err == nil; j++ {
				xs = append(xs, append([]byte{}, d.Bytes("bytes")...))
			}
			as = append(as, xs)
		case argUUID:
			if b := fixed(d, 16); b != nil {
				as = append(as, [16]byte(b))
			}
		default:
			d.Fail("unknown argument tag %d", tag)
		}
	}
	return as
}

func fixed(d *wire.Decoder, n int) []byte {
	if d.Err != nil {
		return nil
	}
	if len(d.B) < n {
		d.Fail("%d bytes in %d", n, len(d.B))
		return nil
	}
	b := d.B[:n]
	d.B = d.B[n:]
	return b
}

// AppendError encodes an error answer.
func AppendError(dst []byte, e *RemoteError) []byte {
	dst = append(dst, e.Kind)
	dst = wire.AppendString(dst, e.Code)
	return wire.AppendString(dst, e.Message)
}

// DecodeError decodes an error answer.
func DecodeError(b []byte) (*RemoteError, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	e := &RemoteError{Kind: d.Byte("kind"), Code: d.String("code"), Message: d.String("message")}
	return e, d.End()
}

// DecodeVersion decodes the hello's answer: the origin's ProtoVersion.
func DecodeVersion(b []byte) (uint64, error) {
	d := wire.Decoder{B: b, Wrap: ErrProtocol}
	v := d.Uvarint("version")
	return v, d.End()
}
