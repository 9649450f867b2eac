package wire

import (
	"encoding/binary"
	"errors"
	"testing"
)

var errTest = errors.New("test")

func TestDecoder(t *testing.T) {
	b := binary.AppendUvarint(nil, 300)
	b = binary.AppendVarint(b, -5)
	b = append(b, 7)
	b = AppendString(b, "héllo")
	b = AppendBytes(b, []byte{0, 1})
	d := Decoder{B: b, Wrap: errTest}
	if d.Uvarint("u") != 300 || d.Varint("v") != -5 || d.Byte("b") != 7 || d.String("s") != "héllo" || string(d.Bytes("x")) != "\x00\x01" || d.End() != nil {
		t.Fatalf("round trip failed: %v", d.Err)
	}
	bad := []struct {
		b  []byte
		do func(*Decoder)
	}{
		{[]byte{0x80}, func(d *Decoder) { d.Uvarint("u") }},
		{nil, func(d *Decoder) { d.Byte("b") }},
		{[]byte{200, 1}, func(d *Decoder) { d.Count("items", 1) }},
		{[]byte{5, 'a'}, func(d *Decoder) { d.Bytes("x") }},
		{[]byte{1, 0xff}, func(d *Decoder) { d.String("s") }},
		{[]byte{1}, func(d *Decoder) {}},
	}
	for i, c := range bad {
		d := Decoder{B: c.b, Wrap: errTest}
		c.do(&d)
		if err := d.End(); !errors.Is(err, errTest) {
			t.Errorf("case %d: %v", i, err)
		}
	}
}
