package recipe

import (
	"context"
	"math/rand/v2"
	"testing"
)

// The codec's cost per MB of result on one core (go test -bench . -cpu 1
// ./internal/recipe): b.SetBytes is the plain result's size, so the MB/s
// column is result megabytes per second. Rows of about 800 bytes, 4 096
// per result (~3.3 MB), as SelectSort's.
const benchRows, benchRowSize = 4096, 800

func benchResult(seed uint64) Result {
	rng := rand.New(rand.NewPCG(seed, 1))
	return result(genRows(rng, benchRows, benchRowSize))
}

func noRefetch(b *testing.B) Origin {
	return OriginFunc(func(context.Context, Refetch) ([]byte, error) {
		b.Fatal("refetch")
		return nil, nil
	})
}

// The origin encodes a result the edge holds none of: every row hashed
// and sent verbatim, and recorded in the model.
func BenchmarkEncodeNew(b *testing.B) {
	res := benchResult(1)
	b.SetBytes(res.Size())
	var out []byte
	for b.Loop() {
		b.StopTimer()
		tr, _ := NewTracker(DefaultConfig())
		b.StartTimer()
		out = tr.AppendRecipe(out[:0], res)
	}
}

// The origin encodes a result whose rows the edge holds, in another
// order: every row hashed and sent as a reference (SelectSort's second
// query).
func BenchmarkEncodeHeld(b *testing.B) {
	res := benchResult(1)
	tr, _ := NewTracker(DefaultConfig())
	tr.AppendRecipe(nil, res)
	again := Result{Header: res.Header, Rows: shuffled(rand.New(rand.NewPCG(2, 2)), res.Rows)}
	b.SetBytes(again.Size())
	var out []byte
	for b.Loop() {
		out = tr.AppendRecipe(out[:0], again)
	}
}

// The edge decodes a verbatim recipe: every row checked against its hash,
// the whole result verified, the rows stored.
func BenchmarkDecodeNew(b *testing.B) {
	res := benchResult(1)
	tr, _ := NewTracker(DefaultConfig())
	msg := tr.AppendRecipe(nil, res)
	b.SetBytes(res.Size())
	for b.Loop() {
		b.StopTimer()
		st, _ := NewRowStore(DefaultConfig())
		b.StartTimer()
		if _, err := st.Decode(context.Background(), msg, noRefetch(b), DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}

// The edge rebuilds a result from references to rows it holds and
// verifies it.
func BenchmarkDecodeHeld(b *testing.B) {
	res := benchResult(1)
	tr, _ := NewTracker(DefaultConfig())
	st, _ := NewRowStore(DefaultConfig())
	if _, err := st.Decode(context.Background(), tr.AppendRecipe(nil, res), noRefetch(b), DefaultLimits()); err != nil {
		b.Fatal(err)
	}
	again := Result{Header: res.Header, Rows: shuffled(rand.New(rand.NewPCG(2, 2)), res.Rows)}
	msg := tr.AppendRecipe(nil, again)
	b.SetBytes(again.Size())
	for b.Loop() {
		if _, err := st.Decode(context.Background(), msg, noRefetch(b), DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}
