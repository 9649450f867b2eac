package quma

import (
	"strings"
	"testing"
)

// A query naming a column the schema does not have is not cacheable: the
// schema is older than the query (a column added since), or PostgreSQL
// will refuse it.
func TestUnknownColumnsAreNotCacheable(t *testing.T) {
	schema, err := LoadDDL(`CREATE TABLE items (id int PRIMARY KEY, name text, qty int)`)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAnalyzer(schema, nil)
	for sql, cacheable := range map[string]bool{
		"SELECT nosuchcol FROM items WHERE id = $1":               false,
		"SELECT i.nosuchcol FROM items i WHERE id = $1":           false,
		"SELECT name FROM items WHERE nosuchcol = $1":             false,
		"SELECT name FROM items WHERE id = $1":                    true,
		"SELECT name AS n FROM items ORDER BY n":                  true,
		"SELECT count(*) AS c FROM items GROUP BY qty ORDER BY c": true,
		"SELECT i FROM items i WHERE id = $1":                     true,
		"SELECT x FROM items, generate_series(1, 3) x":            true,
	} {
		tpl, err := a.Prepare(sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if tpl.Cacheable != cacheable {
			t.Errorf("%s: cacheable %v (%s), want %v", sql, tpl.Cacheable, tpl.Reason, cacheable)
		}
		if !cacheable && !strings.Contains(tpl.Reason, "unknown column") {
			t.Errorf("%s: reason %q", sql, tpl.Reason)
		}
	}
}
