package invalidation

import (
	"errors"
	"reflect"
	"testing"
)

func TestSchemaChangeRoundTrip(t *testing.T) {
	if got := SchemaChangedSubject("larder"); got != "larder.schema.changed" {
		t.Errorf("subject %s", got)
	}
	s := SchemaChange{CommitLSN: 0x16B3748, Flushed: []string{"public.items", "s2.t"}}
	b := s.Append(nil)
	if string(b) != `{"commit_lsn":23803720,"flushed":["public.items","s2.t"]}` {
		t.Errorf("encoded %s", b)
	}
	got, err := DecodeSchemaChange(b)
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Errorf("decoded %+v, %v", got, err)
	}
	if b := (&SchemaChange{CommitLSN: 1}).Append(nil); string(b) != `{"commit_lsn":1,"flushed":[]}` {
		t.Errorf("no tables: %s", b)
	}
	for _, bad := range []string{``, `{}`, `{"commit_lsn":"x"}`, `[1]`} {
		if _, err := DecodeSchemaChange([]byte(bad)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
