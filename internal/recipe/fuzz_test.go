package recipe

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// fuzzLimits keep a fuzzed message from asking for much.
var fuzzLimits = Limits{MaxRows: 1 << 12, MaxResultBytes: 1 << 20}

// seedRecipes are valid recipes: all verbatim, with references, with
// repeated rows, empty.
func seedRecipes() [][]byte {
	rng := rand.New(rand.NewPCG(1, 1))
	rows := genRows(rng, 6, 60)
	tr, _ := NewTracker(DefaultConfig())
	first := tr.AppendRecipe(nil, result(rows[:4]))
	mixed := tr.AppendRecipe(nil, result(append(rows[2:], rows[0], []byte("tiny"), rows[5])))
	return [][]byte{first, mixed, AppendVerbatim(nil, Result{}), AppendVerbatim(nil, result([][]byte{{}, []byte("x")}))}
}

func FuzzParseRecipe(f *testing.F) {
	for _, s := range seedRecipes() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		rc, err := ParseRecipe(msg, fuzzLimits)
		if err != nil {
			if !errors.Is(err, ErrVersion) && !errors.Is(err, ErrKind) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if len(rc.Parts) > fuzzLimits.MaxRows || len(rc.Parts) > len(msg) {
			t.Fatalf("%d parts from %d bytes", len(rc.Parts), len(msg))
		}
		// Written again, it parses to the same recipe.
		w := recipeWriter{sums: make([]Sum, len(rc.Parts)), refs: make([]bool, len(rc.Parts)), rows: make([][]byte, len(rc.Parts))}
		for i, p := range rc.Parts {
			w.refs[i] = p.IsRef
			copy(w.sums[i][:], p.Ref[:])
			w.rows[i] = p.Data
		}
		again, err := ParseRecipe(w.write(rc.Whole, rc.Header), fuzzLimits)
		if err != nil {
			t.Fatalf("rewritten recipe: %v", err)
		}
		if again.Whole != rc.Whole || !bytes.Equal(again.Header, rc.Header) || len(again.Parts) != len(rc.Parts) {
			t.Fatal("rewritten recipe differs")
		}
		for i := range rc.Parts {
			a, b := again.Parts[i], rc.Parts[i]
			if a.IsRef != b.IsRef || a.Ref != b.Ref || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("part %d differs", i)
			}
		}
	})
}

// FuzzRebuild rebuilds fuzzed recipes against a store holding rows: a
// result comes out only if it matches the recipe's whole-result hash.
func FuzzRebuild(f *testing.F) {
	for _, s := range seedRecipes() {
		f.Add(s)
	}
	held := seedRecipes()[0]
	f.Fuzz(func(t *testing.T, msg []byte) {
		rc, err := ParseRecipe(msg, fuzzLimits)
		if err != nil {
			return
		}
		st, _ := NewRowStore(Config{MaxBytes: 4 << 10, MaxRows: 16})
		if _, err := st.Decode(t.Context(), held, nil, fuzzLimits); err != nil {
			t.Fatal(err)
		}
		res, need, err := st.Rebuild(rc, nil, fuzzLimits)
		if err != nil {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		if !need.Empty() {
			if res.Rows != nil || res.Header != nil {
				t.Fatal("a result and a refetch at once")
			}
			return
		}
		if WholeSum(res) != rc.Whole {
			t.Fatal("a result that does not match its whole-result hash")
		}
		if s := st.Stats(); s.Bytes > 4<<10 || s.Rows > 16 {
			t.Fatalf("store over budget: %+v", s)
		}
	})
}

func FuzzParseFill(f *testing.F) {
	rows := [][]byte{[]byte("one row"), {}, bytes.Repeat([]byte{7}, 200)}
	req := Refetch{Hashes: []RowHash{HashRow(rows[0]), HashRow(rows[2])}}
	fill, _ := AppendFill(nil, result(rows), req)
	f.Add(fill)
	f.Add([]byte{Version, KindFill, 0})
	f.Fuzz(func(t *testing.T, msg []byte) {
		fl, err := ParseFill(msg, fuzzLimits)
		if err != nil {
			return
		}
		if len(fl.Rows) > len(msg) {
			t.Fatalf("%d rows from %d bytes", len(fl.Rows), len(msg))
		}
	})
}

func FuzzParseRefetch(f *testing.F) {
	f.Add(Refetch{Hashes: []RowHash{{1}, {2, 3}}}.Append(nil))
	f.Add(Refetch{All: true}.Append(nil))
	f.Fuzz(func(t *testing.T, msg []byte) {
		req, err := ParseRefetch(msg, fuzzLimits)
		if err != nil {
			return
		}
		again, err := ParseRefetch(req.Append(nil), fuzzLimits)
		if err != nil || again.All != req.All || len(again.Hashes) != len(req.Hashes) {
			t.Fatalf("a parsed request written back parses to %+v, %v", again, err)
		}
		for i := range req.Hashes {
			if again.Hashes[i] != req.Hashes[i] {
				t.Fatalf("hash %d differs", i)
			}
		}
	})
}

func FuzzParseReset(f *testing.F) {
	f.Add(AppendReset(nil, DefaultConfig()))
	f.Add(AppendReset(nil, Config{MaxBytes: 1, MaxRows: 1}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		cfg, err := ParseReset(msg)
		if err != nil {
			return
		}
		if cfg.Validate() != nil {
			t.Fatal("an invalid budget accepted")
		}
		if _, err := NewTracker(cfg); err != nil {
			t.Fatal(err)
		}
	})
}
