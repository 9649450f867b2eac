package errwriter

import (
	"errors"
	"strings"
	"testing"
)

type failAfter struct {
	n   int
	out strings.Builder
}

var errFull = errors.New("full")

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errFull
	}
	f.n--
	return f.out.Write(p)
}

func TestKeepsTheFirstError(t *testing.T) {
	f := &failAfter{n: 1}
	w := New(f)
	w.Printf("a%d", 1)
	w.Printf("b")
	w.Printf("c")
	if f.out.String() != "a1" || !errors.Is(w.Err(), errFull) {
		t.Fatalf("wrote %q, err %v", f.out.String(), w.Err())
	}
	if n, err := w.Write([]byte("d")); n != 0 || !errors.Is(err, errFull) {
		t.Fatalf("after the error: %d, %v", n, err)
	}
}
