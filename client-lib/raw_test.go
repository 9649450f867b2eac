package larder

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// wireKey is the cache key of a statement sent on the wire.
func wireKey(t *testing.T, st *WireStatement) string {
	t.Helper()
	args := append(wireTagValues(pgtype.NewMap(), st, false), &wireArgs{st: st, out: &wireOutcome{}})
	k, err := (*Client)(nil).key("scope", st.SQL, args)
	if err != nil {
		t.Fatal(err)
	}
	return string(k)
}

// TestWireKeyHoldsFormats: the key of a statement sent on the wire holds
// the result formats asked for (a text answer is never served to a
// binary request), the parameters' formats and declared types; codes
// that ask for the same answer give the same key.
func TestWireKeyHoldsFormats(t *testing.T) {
	one := binary.BigEndian.AppendUint32(nil, 1)
	st := func(rf, pf []int16, params [][]byte, oids []uint32) *WireStatement {
		return &WireStatement{SQL: "SELECT * FROM t WHERE id = $1", ResultFormats: rf, ParamFormats: pf, Params: params,
			ParamOIDs: oids, ParamTypes: []uint32{pgtype.Int4OID}}
	}
	text := [][]byte{[]byte("1")}
	same := [][2]*WireStatement{
		{st(nil, nil, text, nil), st([]int16{0}, nil, text, nil)},
		{st(nil, nil, text, nil), st([]int16{0, 0, 0}, []int16{0}, text, nil)},
		{st([]int16{1}, nil, text, nil), st([]int16{1, 1}, nil, text, nil)},
	}
	for i, c := range same {
		if wireKey(t, c[0]) != wireKey(t, c[1]) {
			t.Errorf("same answer %d: keys differ", i)
		}
	}
	differ := [][2]*WireStatement{
		{st(nil, nil, text, nil), st([]int16{1}, nil, text, nil)},
		{st([]int16{0, 1}, nil, text, nil), st([]int16{1, 0}, nil, text, nil)},
		{st(nil, nil, text, nil), st(nil, []int16{1}, [][]byte{one}, nil)},
		{st(nil, nil, text, nil), st(nil, nil, text, []uint32{pgtype.Int8OID})},
		{st(nil, nil, [][]byte{nil}, nil), st(nil, nil, [][]byte{{}}, nil)},
	}
	for i, c := range differ {
		if wireKey(t, c[0]) == wireKey(t, c[1]) {
			t.Errorf("different answers %d: same key", i)
		}
	}
}

// TestWireTagValues: parameters reach the analyzer as values it can make
// canonical, and not at all when a declared type could compare otherwise
// than the column's text.
func TestWireTagValues(t *testing.T) {
	m := pgtype.NewMap()
	got := wireTagValues(m, &WireStatement{
		ParamOIDs:    []uint32{0, pgtype.BPCharOID, pgtype.Int4OID, 0, pgtype.NumericOID, 0},
		ParamTypes:   []uint32{pgtype.Int4OID, pgtype.TextOID, pgtype.Int4OID, pgtype.Int4ArrayOID, pgtype.NumericOID, pgtype.TextOID},
		ParamFormats: []int16{0, 0, 1, 0, 0, 0},
		Params:       [][]byte{[]byte("042"), []byte("ab "), binary.BigEndian.AppendUint32(nil, 7), []byte("{1,2}"), []byte("1.0"), nil},
	}, false)
	want := []any{"042", nil, int32(7), []any{int32(1), int32(2)}, nil, nil}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v\nwant %#v", got, want)
	}
	if got := wireTagValues(m, &WireStatement{Params: [][]byte{[]byte("1")}}, true); got[0] != nil {
		t.Fatalf("values of a session that is not cached: %#v", got)
	}
}

// A RESET ALL whose effect is unknown (rolled back with its transaction,
// failed) does not clear what earlier SETs changed: the next RESET ALL
// still makes the scope be read again.
func TestResetAllAfterARolledBackResetAll(t *testing.T) {
	s := &SessionConn{read: true}
	s.ResetAll()
	if s.stale {
		t.Fatal("a RESET ALL on a session that never changed a setting made its scope stale")
	}
	s.Touched(false, true) // SET search_path = foo
	s.ResetAll()           // inside BEGIN … ROLLBACK: undone
	if !s.stale {
		t.Fatal("a RESET ALL after a SET did not make the scope stale")
	}
	s.stale = false // read again (still foo)
	s.ResetAll()    // this one takes effect: back to the default path
	if !s.stale {
		t.Error("the session's settings changed (foo, then the default) but its key scope is not read again")
	}
}
