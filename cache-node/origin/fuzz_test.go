package origin

import (
	"fmt"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/recipe"
)

// FuzzDecode feeds every decoder of the protocol the same bytes: none may
// panic, and what decodes must decode the same once encoded again (varints
// may be written longer than needed, so the bytes may differ).
func FuzzDecode(f *testing.F) {
	f.Add(AppendHello(nil, &Hello{Version: ProtoVersion, EdgeID: "e", Reset: true, Budget: recipe.AppendReset(nil, recipe.DefaultConfig())}))
	f.Add(AppendBegin(nil, &Begin{Snapshot: "00000003-1", TS: 9, SQLFormats: true, Scope: "k", Tables: []string{"public.a"}}))
	f.Add(AppendBegin(nil, &Begin{Snapshot: "00000003-1", TS: 9, ServerStart: time.Date(2026, 5, 1, 12, 0, 0, 123456000, time.UTC), Tables: []string{"public.a"}}))
	q, _ := AppendQuery(nil, &Query{SQL: "SELECT $1", Args: []any{int64(1), "a", nil, []int64{1}, 2.5}})
	f.Add(q)
	f.Add(AppendError(nil, &RemoteError{Kind: kindPostgres, Code: "22023", Message: "m"}))
	f.Add(AppendTables(nil, []string{"a", "b"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := DecodeHello(b); err == nil {
			if h2, err := DecodeHello(AppendHello(nil, &h)); err != nil || fmt.Sprint(h2) != fmt.Sprint(h) {
				t.Fatal("hello does not round-trip")
			}
		}
		if r, err := DecodeBegin(b); err == nil {
			if r2, err := DecodeBegin(AppendBegin(nil, &r)); err != nil || fmt.Sprint(r2) != fmt.Sprint(r) {
				t.Fatal("begin does not round-trip")
			}
		}
		_, _ = DecodeQuery(b)
		if e, err := DecodeError(b); err == nil {
			if e2, err := DecodeError(AppendError(nil, e)); err != nil || *e2 != *e {
				t.Fatal("error does not round-trip")
			}
		}
		_, _ = DecodeTables(b)
		_, _ = DecodeVersion(b)
	})
}
