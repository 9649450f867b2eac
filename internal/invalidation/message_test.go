package invalidation

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleTxn() *Txn {
	return &Txn{
		CommitLSN:  0x16B3748,
		EndLSN:     0x16B3778,
		XID:        4242,
		CommitTime: time.UnixMicro(1795000000123456),
		Changes: []Change{
			{Tag: "public.items", Columns: []string{"max_bid", "nb_of_bids"}},
			{Tag: "public.items(id)=42", Columns: []string{"max_bid", "nb_of_bids"}},
			{Tag: "public.items(seller)=7", Rows: true, Keys: []string{"42", "43"}},
			{Tag: "public.items(category)=3", Columns: []string{"end_date"}, Keys: []string{"42"}},
			{Tag: "public.bids", AllColumns: true},
			{Tag: "public.old_items", Flush: true},
		},
	}
}

func TestTxnRoundTrip(t *testing.T) {
	in := sampleTxn()
	b := AppendTxn(nil, in)
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Heartbeat != nil || !reflect.DeepEqual(m.Txn, in) || m.LSN() != in.CommitLSN {
		t.Fatalf("round trip:\n got %+v\nwant %+v", m.Txn, in)
	}
	h := Heartbeat{LSN: 99, Time: time.UnixMicro(5)}
	m, err = Decode(AppendHeartbeat(nil, h))
	if err != nil || m.Txn != nil || *m.Heartbeat != h || m.LSN() != 99 {
		t.Fatalf("heartbeat: %+v %v", m, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := AppendTxn(nil, sampleTxn())
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"empty":      {nil, ErrCorrupt},
		"version":    {append([]byte{2}, good[1:]...), ErrVersion},
		"kind":       {append([]byte{Version, 9}, good[2:]...), ErrKind},
		"truncated":  {good[:len(good)-3], ErrCorrupt},
		"trailing":   {append(append([]byte(nil), good...), 0), ErrCorrupt},
		"huge count": {[]byte{Version, kindTxn, 1, 1, 1, 2, 0xff, 0xff, 0xff, 0xff, 0x0f}, ErrCorrupt},
		"bad flags":  {AppendTxn(nil, &Txn{Changes: []Change{{Tag: "x"}}}), nil},
	}
	// Corrupt the flags byte of the one-change message.
	bf := cases["bad flags"].b
	flagsAt := bytes.IndexByte(bf, 'x') - 2
	bf[flagsAt] = 0x80
	cases["bad flags"] = struct {
		b    []byte
		want error
	}{bf, ErrCorrupt}

	for name, c := range cases {
		if _, err := Decode(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	unsorted := AppendTxn(nil, &Txn{Changes: []Change{{Tag: "t", Columns: []string{"b", "a"}}}})
	if _, err := Decode(unsorted); err == nil || !strings.Contains(err.Error(), "sorted") {
		t.Errorf("unsorted columns: %v", err)
	}
	unsorted = AppendTxn(nil, &Txn{Changes: []Change{{Tag: "t", Rows: true, Keys: []string{"2", "10"}}}})
	if _, err := Decode(unsorted); err == nil || !strings.Contains(err.Error(), "sorted") {
		t.Errorf("unsorted keys: %v", err)
	}
	var many []string
	for i := 0; i <= MaxKeys; i++ {
		many = append(many, fmt.Sprintf("%03d", i))
	}
	if _, err := Decode(AppendTxn(nil, &Txn{Changes: []Change{{Tag: "t", Rows: true, Keys: many}}})); !errors.Is(err, ErrCorrupt) {
		t.Errorf("%d keys: %v", len(many), err)
	}
}

func TestHits(t *testing.T) {
	upd := Change{Tag: "public.inv(id)=2", Columns: []string{"qty"}}
	cases := []struct {
		c     Change
		reads []string
		all   bool
		want  bool
	}{
		{upd, []string{"entry_date", "name"}, false, false}, // Ferdinand: U2 vs Q4
		{upd, []string{"name", "qty"}, false, true},
		{upd, nil, true, true},
		{Change{Tag: "x"}, nil, true, false}, // an UPDATE that changed nothing
		{Change{Tag: "x", Rows: true}, nil, false, true},
		{Change{Tag: "x", AllColumns: true}, []string{"a"}, false, true},
		{Change{Tag: "x", Flush: true}, nil, false, true},
	}
	for i, c := range cases {
		if got := c.c.Hits(c.reads, c.all); got != c.want {
			t.Errorf("case %d: Hits = %v, want %v", i, got, c.want)
		}
	}
}

func TestMerge(t *testing.T) {
	c := Change{Tag: "t", Columns: []string{"b", "d"}}
	c.Merge(Change{Tag: "t", Columns: []string{"a", "d"}})
	c.Merge(Change{Tag: "t", Rows: true})
	if !c.Rows || !reflect.DeepEqual(c.Columns, []string{"a", "b", "d"}) {
		t.Fatalf("merge: %+v", c)
	}
	// Keys: the union while both know theirs; unknown for good once one
	// does not, or past MaxKeys.
	k := Change{Tag: "t", Rows: true, Keys: []string{"2", "5"}}
	k.Merge(Change{Tag: "t", Rows: true, Keys: []string{"1", "5"}})
	if !reflect.DeepEqual(k.Keys, []string{"1", "2", "5"}) {
		t.Fatalf("keys merged: %v", k.Keys)
	}
	k.Merge(Change{Tag: "t", Rows: true})
	if k.Keys != nil {
		t.Fatalf("keys merged with a change of unknown rows: %v", k.Keys)
	}
	k.Merge(Change{Tag: "t", Rows: true, Keys: []string{"9"}})
	if k.Keys != nil {
		t.Fatalf("unknown keys became known: %v", k.Keys)
	}
	var many, more []string
	for i := 0; i < MaxKeys; i++ {
		many, more = append(many, fmt.Sprintf("a%02d", i)), append(more, fmt.Sprintf("b%02d", i))
	}
	if got := MergeKeys(many, more); got != nil {
		t.Fatalf("%d keys merged: want none past %d", len(got), MaxKeys)
	}
}

func TestSubjects(t *testing.T) {
	a := TagSubject("larder", "public.items(id)=42")
	b := TagSubject("larder", "public.items(id)=43")
	f := FlushSubject("larder", "public.items")
	if a == b || a == f || !strings.HasPrefix(a, "larder.inv.") || len(a) != len("larder.inv.")+16 {
		t.Fatalf("subjects %q %q %q", a, b, f)
	}
	if strings.Contains(a, "42") && strings.Contains(a, "items") {
		t.Fatalf("subject carries raw data: %q", a)
	}
	if StreamName("larder.test") != "LARDER_TEST_INVALIDATIONS" {
		t.Fatal(StreamName("larder.test"))
	}
	if MsgID(0x10, a) == MsgID(0x10, b) || MsgID(0x10, a) == MsgID(0x11, a) {
		t.Fatal("message ids collide")
	}
	for _, p := range []string{"", "a b", "a.>", ".a", "a."} {
		if ValidPrefix(p) == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(AppendTxn(nil, sampleTxn()))
	f.Add(AppendHeartbeat(nil, Heartbeat{LSN: 1, Time: time.UnixMicro(2)}))
	f.Add([]byte{Version, kindTxn})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		var again []byte
		if m.Txn != nil {
			again = AppendTxn(nil, m.Txn)
		} else {
			again = AppendHeartbeat(nil, *m.Heartbeat)
		}
		if !bytes.Equal(again, b) {
			m2, err := Decode(again)
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-encoding differs: %x vs %x (%v)", b, again, err)
			}
		}
	})
}
