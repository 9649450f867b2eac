package origin

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

type itemID int64

type label string

// The arguments the protocol carries come back as the values pgx encodes
// the same way: integers as int64 (named integer types too), pointers
// followed (nil: NULL), arrays for = ANY($n), UUIDs as [16]byte.
func TestArgumentTypes(t *testing.T) {
	n := 42
	var nilInt *int
	s := "x"
	when := time.Date(2026, 11, 24, 10, 0, 0, 123, time.UTC)
	uuid := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	in := []any{nil, true, int8(-3), uint16(7), 1.5, float32(2.5), "s", []byte("b"), when,
		[]int{1, 2}, []string{"a", "b"}, []float64{1.25, -2}, []float32{0.5}, []bool{true, false}, [][]byte{[]byte("p"), {}},
		uuid, &n, nilInt, &s, itemID(9), label("L"), &when}
	want := []any{nil, true, int64(-3), uint64(7), 1.5, float32(2.5), "s", []byte("b"), when,
		[]int64{1, 2}, []string{"a", "b"}, []float64{1.25, -2}, []float64{0.5}, []bool{true, false}, [][]byte{[]byte("p"), {}},
		uuid, int64(42), nil, "x", int64(9), "L", when}
	msg, err := AppendQuery(nil, &Query{SQL: "SELECT", Args: in})
	if err != nil {
		t.Fatal(err)
	}
	q, err := DecodeQuery(msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Args) != len(want) {
		t.Fatalf("%d arguments, want %d", len(q.Args), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(q.Args[i], want[i]) {
			t.Errorf("argument %d (%T): %#v, want %#v", i, in[i], q.Args[i], want[i])
		}
	}
	// A struct, a map, a channel still fail the statement.
	for _, bad := range []any{struct{ A int }{1}, map[string]int{}, make(chan int), []any{1}} {
		if _, err := AppendArgs(nil, []any{bad}); !errors.Is(err, ErrArgs) {
			t.Errorf("%T: %v, want ErrArgs", bad, err)
		}
	}
	// Malformed arrays are protocol errors, not panics.
	for _, b := range [][]byte{{1, argBools, 1, 7}, {1, argFloats, 2, 0}, {1, argUUID, 1, 2}} {
		if _, err := DecodeQuery(append([]byte{0}, b...)); err == nil {
			t.Errorf("%v decoded", b)
		}
	}
}
