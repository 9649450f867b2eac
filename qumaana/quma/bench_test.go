package quma

import (
	"strings"
	"testing"
)

// BenchmarkTagsSeenTemplate measures the online path client-lib runs for
// every query: look up a seen SQL text and instantiate its tags. The
// baseline, BenchmarkPrepareUnseen, is the first sight of a text (parse and
// analyze), which Prepare does once per distinct text.
func BenchmarkTagsSeenTemplate(b *testing.B) {
	cases := map[string]struct {
		sql    string
		params []any
	}{
		"point":  {"SELECT * FROM items WHERE id = $1", []any{int64(42)}},
		"join":   {"SELECT items.name FROM items, users WHERE items.seller = users.id AND users.id = $1", []any{int64(7)}},
		"range":  {"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 20", []any{3, "2026-01-01"}},
		"inlist": {"SELECT name FROM items WHERE id IN ($1, $2, $3)", []any{1, 2, 3}},
	}
	for name, c := range cases {
		b.Run(name, func(b *testing.B) {
			a := NewAnalyzer(mustDDL(b, testSchema), testSets)
			if _, err := a.Prepare(c.sql); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t, err := a.Prepare(c.sql)
				if err != nil {
					b.Fatal(err)
				}
				tags, err := t.Tags(c.params)
				if err != nil {
					b.Fatal(err)
				}
				for _, tg := range tags {
					benchSink = tg.String() // the name client-lib sends with the result
				}
			}
		})
	}
}

var benchSink string

func BenchmarkPrepareUnseen(b *testing.B) {
	schema := mustDDL(b, testSchema)
	sql := "SELECT items.name FROM items, users WHERE items.seller = users.id AND users.id = $1"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		a := NewAnalyzer(schema, testSets)
		if _, err := a.Prepare(sql); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzPrepare feeds arbitrary SQL to the analyzer: it must return a
// template or an error, never panic (the recover in analyzeSQL reports an
// internal error, which this target treats as a failure).
func FuzzPrepare(f *testing.F) {
	for _, s := range []string{
		"SELECT * FROM items WHERE id = $1",
		"SELECT a.name FROM items a LEFT JOIN users u ON u.id = a.seller AND u.region IN (1, $2) WHERE a.id = ANY($1)",
		"WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT * FROM r, cheap",
		"SELECT (SELECT max(id) FROM users WHERE users.id = items.seller) FROM items NATURAL JOIN comments",
		"UPDATE items SET qty = 1 FROM users WHERE users.id = items.seller",
		"SELECT 1; SELECT 2",
		"SELECT * FROM items WHERE id = = 1",
	} {
		f.Add(s)
	}
	schema := mustDDL(f, testSchema)
	f.Fuzz(func(t *testing.T, sql string) {
		a := NewAnalyzer(schema, testSets)
		tpl, err := a.Prepare(sql)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("%q: %v", sql, err)
			}
			return
		}
		if tpl.Cacheable && tpl.NumParams <= 1000 {
			params := make([]any, tpl.NumParams)
			for i := range params {
				params[i] = i
			}
			if _, err := tpl.Tags(params); err != nil {
				t.Fatalf("%q: tags: %v", sql, err)
			}
		}
	})
}
