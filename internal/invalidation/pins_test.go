package invalidation

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func samplePins() []Pin {
	at := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	start := time.Date(2026, 11, 21, 8, 30, 0, 654321000, time.UTC)
	return []Pin{
		{SnapshotID: "00000003-0000001B-1", LSN: 0x16B3748, TakenAt: at, ExpiresAt: at.Add(time.Minute), ServerStart: start},
		{SnapshotID: "00000004-00000020-1", LSN: 0x1_0000_0000, TakenAt: at.Add(200 * time.Millisecond), ExpiresAt: at.Add(time.Minute + 200*time.Millisecond), ServerStart: start},
		{SnapshotID: "x_y-Z", LSN: 1},
	}
}

func pinsEqual(a, b Pin) bool {
	return a.SnapshotID == b.SnapshotID && a.LSN == b.LSN && a.TakenAt.Equal(b.TakenAt) && a.ExpiresAt.Equal(b.ExpiresAt) &&
		a.ServerStart.Equal(b.ServerStart)
}

// pinV1Body encodes a pin's body as version 1 wrote it (no server start).
func pinV1Body(dst []byte, p Pin) []byte {
	dst = binary.AppendUvarint(dst, p.LSN)
	dst = pinAppendTime(dst, p.TakenAt)
	dst = pinAppendTime(dst, p.ExpiresAt)
	return pinAppendString(dst, p.SnapshotID)
}

// TestPinVersion1 decodes pins and pin lists as a version 1 pincushion
// writes them: the same pins, their server start unknown (zero).
func TestPinVersion1(t *testing.T) {
	pins := samplePins()
	want := make([]Pin, len(pins))
	for i, p := range pins {
		p.ServerStart = time.Time{}
		want[i] = p
	}
	for i, p := range pins {
		got, err := DecodePin(pinV1Body([]byte{1, pinKindPin}, p))
		if err != nil {
			t.Fatalf("version 1 pin %d: %v", i, err)
		}
		if !pinsEqual(got, want[i]) || !got.ServerStart.IsZero() {
			t.Fatalf("version 1 pin %d: got %+v, want %+v", i, got, want[i])
		}
	}
	list := binary.AppendUvarint([]byte{1, pinKindList}, uint64(len(pins)))
	for _, p := range pins {
		list = pinV1Body(list, p)
	}
	got, err := DecodePinList(list)
	if err != nil {
		t.Fatalf("version 1 pin list: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("version 1 pin list: %d pins, want %d", len(got), len(want))
	}
	for i := range want {
		if !pinsEqual(got[i], want[i]) {
			t.Fatalf("version 1 pin list item %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	// A version 1 body read as version 2 lacks the server start; a
	// version 2 body read as version 1 has bytes after the end.
	if _, err := DecodePin(pinV1Body([]byte{2, pinKindPin}, pins[0])); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 1 body labelled 2: error %v, want ErrCorrupt", err)
	}
	v2 := EncodePin(pins[0])
	if v2[0] != 2 {
		t.Fatalf("EncodePin writes version %d, want 2", v2[0])
	}
	v2[0] = 1
	if _, err := DecodePin(v2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 2 body labelled 1: error %v, want ErrCorrupt", err)
	}
	// Verify messages did not change: they are written in version 1 (a
	// version 1 build reads them) and read in either.
	q := PinVerifyRequest{Xmin: 5, Xmax: 9, Xip: []uint64{6}, InsertLSN: 7}
	b := EncodePinVerifyRequest(q)
	if b[0] != 1 {
		t.Fatalf("EncodePinVerifyRequest writes version %d, want 1", b[0])
	}
	b[0] = 2
	if got, err := DecodePinVerifyRequest(b); err != nil || !reflect.DeepEqual(got, q) {
		t.Fatalf("version 2 verify request: %+v, %v", got, err)
	}
	r := EncodePinVerifyReply(PinVerifyReply{OK: true, TS: 3})
	if r[0] != 1 {
		t.Fatalf("EncodePinVerifyReply writes version %d, want 1", r[0])
	}
}

func TestPinOtherServer(t *testing.T) {
	a := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	b := a.Add(time.Microsecond)
	for _, c := range []struct {
		pin, conn time.Time
		want      bool
	}{
		{a, a, false},
		{a, a.In(time.FixedZone("x", 3600)), false},
		{a, b, true},
		{time.Time{}, a, false},
		{a, time.Time{}, false},
	} {
		if got := (Pin{ServerStart: c.pin}).OtherServer(c.conn); got != c.want {
			t.Errorf("pin started %v, connection %v: OtherServer = %v, want %v", c.pin, c.conn, got, c.want)
		}
	}
}

func TestPinRoundTrip(t *testing.T) {
	for _, p := range samplePins() {
		got, err := DecodePin(EncodePin(p))
		if err != nil {
			t.Fatalf("DecodePin(EncodePin(%+v)): %v", p, err)
		}
		if !pinsEqual(got, p) {
			t.Fatalf("round trip: got %+v, want %+v", got, p)
		}
	}
}

func TestPinListRoundTrip(t *testing.T) {
	for _, pins := range [][]Pin{nil, samplePins()[:1], samplePins()} {
		got, err := DecodePinList(EncodePinList(pins))
		if err != nil {
			t.Fatalf("DecodePinList: %v", err)
		}
		if len(got) != len(pins) {
			t.Fatalf("got %d pins, want %d", len(got), len(pins))
		}
		for i := range pins {
			if !pinsEqual(got[i], pins[i]) {
				t.Fatalf("pin %d: got %+v, want %+v", i, got[i], pins[i])
			}
		}
	}
}

func TestPinVerifyRoundTrip(t *testing.T) {
	for _, q := range []PinVerifyRequest{
		{Xmin: 100, Xmax: 100, InsertLSN: 5},
		{Xmin: 1<<32 + 7, Xmax: 1<<32 + 90, Xip: []uint64{1<<32 + 7, 1<<32 + 8, 1<<32 + 89}, InsertLSN: 0xFFFF_FFFF_FFFF},
	} {
		got, err := DecodePinVerifyRequest(EncodePinVerifyRequest(q))
		if err != nil {
			t.Fatalf("DecodePinVerifyRequest: %v", err)
		}
		if !reflect.DeepEqual(got, q) {
			t.Fatalf("round trip: got %+v, want %+v", got, q)
		}
	}
	for _, r := range []PinVerifyReply{
		{TS: 0x16B3747, OK: true},
		{Reason: "xid 12 is in progress in the snapshot but committed at 0/16B3748"},
	} {
		got, err := DecodePinVerifyReply(EncodePinVerifyReply(r))
		if err != nil {
			t.Fatalf("DecodePinVerifyReply: %v", err)
		}
		if got != r {
			t.Fatalf("round trip: got %+v, want %+v", got, r)
		}
	}
}

func TestPinSubjects(t *testing.T) {
	if got := PinAnnounceSubject("larder"); got != "larder.pins.announce" {
		t.Errorf("PinAnnounceSubject = %q", got)
	}
	if got := PinReleaseSubject("larder"); got != "larder.pins.release" {
		t.Errorf("PinReleaseSubject = %q", got)
	}
	if got := PinListSubject("a.b"); got != "a.b.pins.list" {
		t.Errorf("PinListSubject = %q", got)
	}
	if got := PinVerifySubject("larder"); got != "larder.pins.verify" {
		t.Errorf("PinVerifySubject = %q", got)
	}
}

func TestPinDecodeRejects(t *testing.T) {
	pin := EncodePin(samplePins()[0])
	noStart := EncodePin(samplePins()[2]) // ends in its snapshot id and a 1-byte unset server start
	withByte := func(b []byte, i int, c byte) []byte {
		b = append([]byte(nil), b...)
		b[i] = c
		return b
	}
	cases := []struct {
		name   string
		decode func([]byte) error
		in     []byte
		want   error
		substr string
	}{
		{"empty", decPin, nil, ErrCorrupt, "0 bytes"},
		{"version", decPin, withByte(pin, 0, 9), ErrVersion, "version 9"},
		{"version 0", decPin, withByte(pin, 0, 0), ErrVersion, "version 0"},
		{"server start", decPin, pin[:len(pin)-1], ErrCorrupt, "server start"},
		{"kind", decPin, EncodePinList(nil), ErrKind, "kind 0x11"},
		{"truncated", decPin, noStart[:len(noStart)-3], ErrCorrupt, "snapshot id"},
		{"trailing", decPin, append(append([]byte(nil), pin...), 0), ErrCorrupt, "after the end"},
		{"bad id", decPin, EncodePin(Pin{SnapshotID: "x'; DROP", LSN: 1}), ErrCorrupt, "snapshot id"},
		{"empty id", decPin, EncodePin(Pin{LSN: 1}), ErrCorrupt, "snapshot id"},
		{"long id", decPin, EncodePin(Pin{SnapshotID: strings.Repeat("a", 65), LSN: 1}), ErrCorrupt, "snapshot id"},
		{"overlong varint", decPin, []byte{PinVersion, pinKindPin, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrCorrupt, "LSN"},
		{"list count", decList, []byte{PinVersion, pinKindList, 0xff, 0xff, 0x03}, ErrCorrupt, "pin count"},
		{"xmin past xmax", decReq, EncodePinVerifyRequest(PinVerifyRequest{Xmin: 9, Xmax: 8, InsertLSN: 1}), ErrCorrupt, "xmin 9 is past xmax 8"},
		{"xip out of range", decReq, EncodePinVerifyRequest(PinVerifyRequest{Xmin: 5, Xmax: 8, Xip: []uint64{8}, InsertLSN: 1}), ErrCorrupt, "outside"},
		{"xip order", decReq, EncodePinVerifyRequest(PinVerifyRequest{Xmin: 5, Xmax: 9, Xip: []uint64{7, 6}, InsertLSN: 1}), ErrCorrupt, "does not follow"},
		{"xip count", decReq, []byte{PinVersion, pinKindVerifyRequest, 1, 2, 0xff, 0x7f, 3}, ErrCorrupt, "in-progress xid count"},
		{"insert LSN 0", decReq, EncodePinVerifyRequest(PinVerifyRequest{Xmin: 5, Xmax: 9}), ErrCorrupt, "insert LSN is 0"},
		{"ok flag", decReply, []byte{PinVersion, pinKindVerifyReply, 2, 0, 0}, ErrCorrupt, "ok flag 2"},
		{"ok with reason", decReply, EncodePinVerifyReply(PinVerifyReply{OK: true, TS: 3, Reason: "x"}), ErrCorrupt, "carries a reason"},
		{"refusal with ts", decReply, EncodePinVerifyReply(PinVerifyReply{TS: 3, Reason: "x"}), ErrCorrupt, "carries timestamp"},
		{"reason not utf8", decReply, []byte{PinVersion, pinKindVerifyReply, 0, 0, 1, 0xff}, ErrCorrupt, "not UTF-8"},
		{"long reason", decReply, EncodePinVerifyReply(PinVerifyReply{Reason: strings.Repeat("r", PinMaxReason+1)}), ErrCorrupt, "reason of"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.decode(c.in)
			if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.substr) {
				t.Fatalf("error %q does not mention %q", err, c.substr)
			}
		})
	}
}

// TestStalenessDemand: a client's staleness demand is whole milliseconds,
// rounded up, within 1 ms and a day; anything else is refused.
func TestStalenessDemand(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{30 * time.Second, 30 * time.Second},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{0, time.Millisecond},
		{-time.Second, time.Millisecond},
		{48 * time.Hour, 24 * time.Hour},
	} {
		got, err := DecodeStalenessDemand(EncodeStalenessDemand(c.in))
		if err != nil || got != c.want {
			t.Errorf("demand %s: decoded %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for name, b := range map[string][]byte{
		"zero":      {1, pinKindDemand, 0},
		"over":      binary.AppendUvarint([]byte{1, pinKindDemand}, PinMaxDemandMillis+1),
		"trailing":  append(EncodeStalenessDemand(time.Second), 0),
		"truncated": {1, pinKindDemand},
		"a pin":     EncodePin(samplePins()[0]),
		"version 9": {9, pinKindDemand, 1},
	} {
		if _, err := DecodeStalenessDemand(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if got := PinHorizonSubject("larder"); got != "larder.pins.horizon" {
		t.Errorf("subject %q", got)
	}
}

func decPin(b []byte) error   { _, err := DecodePin(b); return err }
func decList(b []byte) error  { _, err := DecodePinList(b); return err }
func decReq(b []byte) error   { _, err := DecodePinVerifyRequest(b); return err }
func decReply(b []byte) error { _, err := DecodePinVerifyReply(b); return err }

// FuzzPinDecode feeds arbitrary bytes to every pin decoder: none may
// panic, and whatever decodes must survive another encode/decode round
// unchanged.
func FuzzPinDecode(f *testing.F) {
	f.Add(EncodePin(samplePins()[0]))
	f.Add(EncodePinList(samplePins()))
	f.Add(EncodePinVerifyRequest(PinVerifyRequest{Xmin: 5, Xmax: 9, Xip: []uint64{6, 8}, InsertLSN: 77}))
	f.Add(EncodePinVerifyReply(PinVerifyReply{Reason: "no"}))
	f.Add(EncodePinVerifyReply(PinVerifyReply{OK: true, TS: 12}))
	f.Add([]byte{PinVersion, pinKindList, 0x80})
	f.Add(pinV1Body([]byte{1, pinKindPin}, samplePins()[0]))
	f.Add(append(binary.AppendUvarint([]byte{1, pinKindList}, 1), pinV1Body(nil, samplePins()[1])...))
	f.Add(EncodeStalenessDemand(30 * time.Second))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := DecodeStalenessDemand(b); err == nil {
			again, err := DecodeStalenessDemand(EncodeStalenessDemand(d))
			if err != nil || again != d {
				t.Fatalf("staleness demand %s: re-decoded %s, %v", d, again, err)
			}
		}
		if p, err := DecodePin(b); err == nil {
			again, err := DecodePin(EncodePin(p))
			if err != nil || !pinsEqual(again, p) {
				t.Fatalf("pin %+v: re-decoded %+v, %v", p, again, err)
			}
		}
		if pins, err := DecodePinList(b); err == nil {
			again, err := DecodePinList(EncodePinList(pins))
			if err != nil || len(again) != len(pins) {
				t.Fatalf("pin list of %d: re-decoded %d, %v", len(pins), len(again), err)
			}
			for i := range pins {
				if !pinsEqual(again[i], pins[i]) {
					t.Fatalf("pin list item %d: %+v became %+v", i, pins[i], again[i])
				}
			}
		}
		if q, err := DecodePinVerifyRequest(b); err == nil {
			again, err := DecodePinVerifyRequest(EncodePinVerifyRequest(q))
			if err != nil || !reflect.DeepEqual(again, q) {
				t.Fatalf("verify request %+v: re-decoded %+v, %v", q, again, err)
			}
		}
		if r, err := DecodePinVerifyReply(b); err == nil {
			again, err := DecodePinVerifyReply(EncodePinVerifyReply(r))
			if err != nil || again != r {
				t.Fatalf("verify reply %+v: re-decoded %+v, %v", r, again, err)
			}
		}
	})
}
