package origin

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/wire"
)

// A begin carries its pin's server start; one without it is the same
// bytes as before the server start existed, and those decode as before.
func TestBeginServerStart(t *testing.T) {
	start := time.Date(2026, 5, 1, 12, 0, 0, 123456000, time.UTC)
	for _, b := range []Begin{
		{Snapshot: "00000003-0000001A-1", TS: 0x16B3748, ServerStart: start, SQLFormats: true, Scope: "k", Tables: []string{"public.a", "public.b"}},
		{Snapshot: "00000003-0000001A-1", TS: 7, ServerStart: start.In(time.FixedZone("x", 7200))},
		{Snapshot: "s", TS: 1, Tables: []string{"public.a"}},
	} {
		got, err := DecodeBegin(AppendBegin(nil, &b))
		if err != nil {
			t.Fatalf("%+v: %v", b, err)
		}
		if !got.ServerStart.Equal(b.ServerStart) {
			t.Fatalf("server start %v, want %v", got.ServerStart, b.ServerStart)
		}
		got.ServerStart, b.ServerStart = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("round trip: %+v, want %+v", got, b)
		}
	}

	// The format before the server start: snapshot, ts, flags, scope,
	// tables.
	old := wire.AppendString(nil, "00000003-0000001A-1")
	old = binary.AppendUvarint(old, 9)
	old = append(old, beginSQLFormats)
	old = wire.AppendString(old, "k")
	old = AppendTables(old, []string{"public.a"})
	got, err := DecodeBegin(old)
	if err != nil {
		t.Fatal(err)
	}
	want := Begin{Snapshot: "00000003-0000001A-1", TS: 9, SQLFormats: true, Scope: "k", Tables: []string{"public.a"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("earlier format: %+v, want %+v", got, want)
	}
	if enc := AppendBegin(nil, &want); string(enc) != string(old) {
		t.Fatalf("a begin without a server start encodes as %x, the earlier format is %x", enc, old)
	}

	// The flag with a zero server start, or none at all, is refused.
	bad := wire.AppendString(nil, "s")
	bad = binary.AppendUvarint(bad, 1)
	bad = append(bad, beginServerStart)
	zero := binary.AppendVarint(append([]byte(nil), bad...), 0)
	zero = wire.AppendString(zero, "")
	zero = AppendTables(zero, nil)
	for _, b := range [][]byte{zero, bad} {
		if _, err := DecodeBegin(b); !errors.Is(err, ErrProtocol) {
			t.Errorf("%x: %v, want ErrProtocol", b, err)
		}
	}
	if _, err := DecodeBegin(wire.AppendString(nil, "s")); err == nil {
		t.Error("a truncated begin decoded")
	}
}
