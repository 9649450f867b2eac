package larder

import (
	"bytes"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestKeysAreInjective: the reported collisions of the %T/%v keys. A
// pointer reused for several values (its address is the same), strings
// that differ only around a NUL, a time with and without its monotonic
// reading, and values of different types that print alike.
func TestKeysAreInjective(t *testing.T) {
	c := &Client{}
	const sql = "SELECT name FROM items WHERE id = $1"
	key := func(scope, sql string, args ...any) []byte {
		t.Helper()
		k, err := c.key(scope, sql, args)
		if err != nil {
			t.Fatalf("key(%q, %v): %v", sql, args, err)
		}
		return k
	}

	// One pointer, three values: three keys (the old key named the address).
	id := 21
	p := &id
	k21 := key("s", sql, p)
	id = 22
	k22 := key("s", sql, p)
	if bytes.Equal(k21, k22) {
		t.Fatal("a reused pointer gives one key for ids 21 and 22")
	}
	// A pointer counts by its value: &22 and 22 name one statement input.
	if !bytes.Equal(k22, key("s", sql, 22)) {
		t.Fatal("a pointer to 22 and 22 itself are keyed apart")
	}

	// Strings with NULs and separators never run into their neighbours.
	distinct := [][]any{
		{"a\x00b", "c"},
		{"a", "\x00b\x00c"},
		{"a\x00b\x00c"},
		{"a", "b", "c"},
		{"ab", "c"},
		{"a", "bc"},
		{[]byte("ab"), "c"},
		{"1"},
		{1},
		{int64(1)},
		{1.0},
		{true},
		{nil},
		{""},
		{[]byte{}},
		{[]int{1, 2}},
		{[]int{12}},
		{pgtype.Int4{Int32: 1, Valid: true}},
		{pgtype.Int4{}},
	}
	seen := map[string]int{}
	for i, args := range distinct {
		k := string(key("s", sql, args...))
		if j, ok := seen[k]; ok {
			t.Errorf("arguments %#v and %#v share a key", distinct[j], args)
		}
		seen[k] = i
	}

	// Scope, SQL text and arguments are length-prefixed: moving bytes from
	// one to the next changes the key.
	if bytes.Equal(key("ab", "c"), key("a", "bc")) {
		t.Error("scope and SQL text run into each other")
	}
	// Literals are part of the statement.
	if bytes.Equal(key("s", "SELECT 1 WHERE $1 = 1", 1), key("s", "SELECT 1 WHERE $1 = 2", 1)) {
		t.Error("statements differing in a literal share a key")
	}

	// Equal times are equal keys, with or without a monotonic reading.
	now := time.Now()
	if !bytes.Equal(key("s", sql, now), key("s", sql, now.Round(0))) {
		t.Error("a time's monotonic reading splits equal times")
	}
	// The same instant in another zone is not the same text for
	// PostgreSQL's timestamp (without time zone): keyed apart.
	if bytes.Equal(key("s", sql, now.UTC()), key("s", sql, now.In(time.FixedZone("x", 3600)))) {
		t.Error("one instant in two zones shares a key")
	}

	// What has no canonical form is not cached at all.
	if _, err := c.key("s", sql, []any{struct{ A int }{1}}); err == nil {
		t.Error("a struct argument was keyed")
	}
}
