package quma

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// splitText renders a template's row splits: table:output=key[membership|display].
func splitText(t *Template) string {
	var parts []string
	for _, d := range t.Deps {
		if s := d.Rows; s != nil {
			parts = append(parts, fmt.Sprintf("%s:%d=%s[%s|%s]", d.Table, s.Output, s.KeyColumn,
				strings.Join(s.Membership, ","), strings.Join(s.Display, ",")))
		}
	}
	return strings.Join(parts, " ")
}

func TestRowSplits(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		// The search page: the category decides the rows, price and name are shown.
		{"SELECT id, name, price FROM items WHERE category = $1 ORDER BY end_date LIMIT 20 OFFSET $2",
			"public.items:0=id[category,end_date,id|name,price]"},
		// A join: users decides membership only; items' key is the second output.
		{"SELECT items.name, items.id, items.price FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 ORDER BY items.end_date LIMIT 20",
			"public.items:1=id[category,end_date,id,seller|name,price]"},
		{"SELECT i.id, i.name, u.id, u.nickname FROM items i JOIN users u ON u.id = i.seller WHERE i.category = $1",
			"public.items:0=id[category,id,seller|name] public.users:2=id[id|nickname]"},
		// A column both shown and filtered on is membership.
		{"SELECT id, name, price FROM items WHERE category = $1 AND price < $2", "public.items:0=id[category,id,price|name]"},
		// Ordering by a shown column makes it membership.
		{"SELECT id, name, price FROM items WHERE category = $1 ORDER BY price DESC LIMIT 5", "public.items:0=id[category,id,price|name]"},
		// Keyed on the row already: nothing to split.
		{"SELECT id, name FROM items WHERE id = $1", ""},
		// Not split: no key among the outputs, only the key, SELECT *, an
		// expression, an aggregate, DISTINCT, a subquery, an outer join, a
		// position or alias in ORDER BY, a table twice, a view, a set operation.
		{"SELECT name, price FROM items WHERE category = $1", ""},
		{"SELECT id FROM items WHERE category = $1", ""},
		// A star: every column but those deciding membership is shown.
		{"SELECT * FROM items WHERE category = $1 ORDER BY end_date", "public.items:0=id[category,end_date,id|code,name,price,qty,seller]"},
		{"SELECT i.*, u.nickname FROM items i JOIN users u ON u.id = i.seller WHERE i.category = $1", "public.items:0=id[category,id,seller|code,end_date,name,price,qty]"},
		// Not with a system column or a whole-row reference in a predicate.
		{"SELECT id, name FROM items WHERE category = $1 AND xmin::text <> ''", ""},
		{"SELECT i.id, i.name FROM items i WHERE i.category = $1 AND i IS NOT NULL", ""},
		{"SELECT id, price * 2 FROM items WHERE category = $1", ""},
		{"SELECT id, count(*) FROM items WHERE category = $1 GROUP BY id", ""},
		{"SELECT DISTINCT id, name FROM items WHERE category = $1", ""},
		{"SELECT id, name FROM items WHERE category = $1 AND seller IN (SELECT id FROM users WHERE region = $2)", ""},
		{"SELECT i.id, i.name FROM items i LEFT JOIN users u ON u.id = i.seller WHERE i.category = $1", ""},
		{"SELECT id, name, price FROM items WHERE category = $1 ORDER BY 3", ""},
		{"SELECT id, name, price AS p FROM items WHERE category = $1 ORDER BY p", ""},
		{"SELECT a.id, a.name FROM items a, items b WHERE a.seller = b.seller AND b.id = $1", ""},
		{"SELECT id, name FROM cheap", ""},
		{"SELECT id, name FROM items WHERE category = 1 UNION SELECT id, name FROM items WHERE category = 2", ""},
		{"WITH c AS (SELECT 1) SELECT id, name FROM items WHERE category = $1", ""},
		{"SELECT id, name FROM items WHERE category = $1 FOR UPDATE", ""},
	} {
		tpl := prepare(t, c.sql)
		if got := splitText(tpl); got != c.want {
			t.Errorf("%s\n  split %q, want %q (deps %s)", c.sql, got, c.want, depText(tpl))
		}
	}
}

// A split needs the key's own tag column set: without it the invalidator
// publishes no tag a row could hold.
func TestRowSplitNeedsTheKeySet(t *testing.T) {
	sets := map[string][][]string{"public.items": {{"category"}}}
	tpl, err := NewAnalyzer(mustDDL(t, testSchema), sets).Prepare("SELECT id, name FROM items WHERE category = $1")
	if err != nil {
		t.Fatal(err)
	}
	if got := splitText(tpl); got != "" {
		t.Errorf("split %q without a set on items(id)", got)
	}
}

func TestSplitRowsNarrowsTags(t *testing.T) {
	tpl := prepare(t, "SELECT id, name, price FROM items WHERE category = $1 ORDER BY end_date LIMIT 20")
	qtags, err := tpl.Tags([]any{7})
	if err != nil {
		t.Fatal(err)
	}
	render := func(qs []QueryTag) string {
		var parts []string
		for _, q := range qs {
			parts = append(parts, q.Tag.String()+"["+strings.Join(q.Reads, ",")+"]")
		}
		return strings.Join(parts, " ")
	}
	split, ok := tpl.SplitRows(qtags, 3, func(s *RowSplit) ([]int64, bool) {
		if s.Output != 0 || s.OutputName != "id" || !slices.Equal(s.Outputs, []string{"id", "name", "price"}) {
			t.Errorf("asked for output %d named %q of %v, want 0 named id of [id name price]", s.Output, s.OutputName, s.Outputs)
		}
		return []int64{4, 9, 4}, true
	})
	want := "public.items(category)=7[category,end_date,id] public.items(id)=4[name,price] public.items(id)=9[name,price]"
	if !ok || render(split) != want {
		t.Errorf("split %v %q, want %q", ok, render(split), want)
	}
	whole := render(qtags)
	if whole != "public.items(category)=7[category,end_date,id,name,price]" {
		t.Errorf("Tags changed by SplitRows: %q", whole)
	}
	// A NULL key, a count that is not the result's, too many rows: whole.
	for name, keys := range map[string]func(*RowSplit) ([]int64, bool){
		"null":  func(*RowSplit) ([]int64, bool) { return nil, false },
		"count": func(*RowSplit) ([]int64, bool) { return []int64{1}, true },
	} {
		if got, ok := tpl.SplitRows(qtags, 3, keys); ok || render(got) != whole {
			t.Errorf("%s: split %v %q, want the tags whole", name, ok, render(got))
		}
	}
	if _, ok := tpl.SplitRows(qtags, maxRowTags+1, func(*RowSplit) ([]int64, bool) { return make([]int64, maxRowTags+1), true }); ok {
		t.Error("split a result of more than maxRowTags rows")
	}
	// Out of the key's range: whole.
	tpl2 := prepare(t, "SELECT id, name FROM items WHERE category = $1")
	q2, _ := tpl2.Tags([]any{1})
	if _, ok := tpl2.SplitRows(q2, 1, func(*RowSplit) ([]int64, bool) { return []int64{1 << 40}, true }); ok {
		t.Error("split on an int4 key of 2^40")
	}
}

// The key's output name is its alias when it has one: a client checks the
// result's column name against it.
func TestRowSplitOutputName(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT name, id FROM items WHERE category = $1":         "id",
		"SELECT name, id AS item FROM items WHERE category = $1": "item",
	} {
		tpl := prepare(t, sql)
		if len(tpl.Deps) != 1 || tpl.Deps[0].Rows == nil {
			t.Fatalf("%s: not split (%s)", sql, depText(tpl))
		}
		if s := tpl.Deps[0].Rows; s.Output != 1 || s.OutputName != want {
			t.Errorf("%s: key at output %d named %q, want 1 named %q", sql, s.Output, s.OutputName, want)
		}
	}
}

// A split whose outputs are all columns of its table can read its rows
// again by key (RowSplit.Fetch), the outputs in order, a star expanded;
// one that shows another table's columns cannot.
func TestRowSplitFetch(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT id, name, price FROM items WHERE category = $1 ORDER BY end_date LIMIT 20":                                                  `SELECT "id", "name", "price" FROM "public"."items" WHERE "id" = ANY($1)`,
		"SELECT items.name, items.id AS item FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2": `SELECT "name", "id" FROM "public"."items" WHERE "id" = ANY($1)`,
		"SELECT * FROM items WHERE category = $1":                                                            `SELECT "id", "name", "category", "seller", "price", "end_date", "code", "qty" FROM "public"."items" WHERE "id" = ANY($1)`,
		"SELECT i.id, i.name, u.nickname FROM items i JOIN users u ON u.id = i.seller WHERE i.category = $1": "",
	} {
		tpl := prepare(t, sql)
		var got []string
		for _, d := range tpl.Deps {
			if d.Rows != nil {
				got = append(got, d.Rows.Fetch)
			}
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s\n  fetch %q, want %q", sql, got, want)
		}
	}
	if got := fetchSQL(`odd.schema.t"x`, []string{`a"b`}, "id"); got != "" {
		t.Errorf("fetch for a table name with two dots: %q", got)
	}
	if got := fetchSQL(`s.t"x`, []string{`a"b`}, "id"); got != `SELECT "a""b" FROM "s"."t""x" WHERE "id" = ANY($1)` {
		t.Errorf("quoting: %q", got)
	}
}

// A page whose rows start at a lower bound given as a parameter, ordered
// by the bound's column, carries its membership to higher bounds
// (RowSplit.Carry); any other form does not.
func TestRowSplitCarry(t *testing.T) {
	const fetch = `SELECT "id", "name" FROM "public"."items" WHERE "id" = ANY($1)`
	for sql, want := range map[string]string{
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 20 OFFSET $3":                                                                                       `$2 offset $3: ` + fetch + ` AND "end_date" >= $2`,
		"SELECT id, name FROM items WHERE end_date > $1 AND category = $2 ORDER BY end_date ASC, id LIMIT 20":                                                                                          `$1 offset $0: ` + fetch + ` AND "end_date" > $2`,
		"SELECT items.id, items.name FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND items.end_date >= $3 ORDER BY items.end_date LIMIT 20 OFFSET 0": `$3 offset $0: ` + fetch + ` AND "end_date" >= $2`,
		// No LIMIT: every row from the bound up, in any order.
		"SELECT id, name FROM items WHERE category = $1 AND qty >= $2": `$2 offset $0: ` + fetch + ` AND "qty" >= $2`,
		// Not: ordered by another column, descending, no ordering with a
		// LIMIT, the bound used twice, cast, on the left, an upper bound,
		// a literal offset, WITH TIES.
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY price LIMIT 20":                         "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date DESC LIMIT 20":                 "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 LIMIT 20":                                        "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 AND qty < $2 ORDER BY end_date LIMIT 20":         "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2::date ORDER BY end_date LIMIT 20":                "",
		"SELECT id, name FROM items WHERE category = $1 AND $2 <= end_date ORDER BY end_date LIMIT 20":                      "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date <= $2 ORDER BY end_date LIMIT 20":                      "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 20 OFFSET 20":            "",
		"SELECT id, name FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date FETCH FIRST 20 ROWS WITH TIES": "",
	} {
		tpl := prepare(t, sql)
		got := ""
		for _, d := range tpl.Deps {
			if c := d.Rows.carry(); c != nil {
				got = fmt.Sprintf("$%d offset $%d: %s", c.Param, c.Offset, c.Fetch)
			}
		}
		if got != want {
			t.Errorf("%s\n  carry %q, want %q", sql, got, want)
		}
	}
}

func (s *RowSplit) carry() *Carry {
	if s == nil {
		return nil
	}
	return s.Carry
}

// Which split templates get a Repair, and its statement: the table's
// rows narrowed to the keys ($ one past the last parameter) in a subquery
// found by key first, or in the WHERE when the table cannot be put in
// one.
func TestRowSplitRepair(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT id, name, end_date FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 20 OFFSET $3": `limit 20/$0 offset $3 sort 2 keys $4: ` +
			"SELECT id, name, end_date FROM (SELECT id, name, category, end_date FROM items WHERE id = ANY($4) OFFSET 0) items WHERE category = $1 AND end_date >= $2 ORDER BY end_date OFFSET $3" +
			" wide $4: SELECT id, name, end_date FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT $4 OFFSET $3",
		"SELECT items.id, items.name, items.end_date FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 ORDER BY items.end_date LIMIT $3": `limit 0/$3 offset $0 sort 2 keys $4: ` +
			"SELECT items.id, items.name, items.end_date FROM (SELECT id, name, category, seller, end_date FROM items WHERE id = ANY($4) OFFSET 0) items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 ORDER BY items.end_date LIMIT $3" +
			" wide $3: SELECT items.id, items.name, items.end_date FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 ORDER BY items.end_date LIMIT $3",
		// No LIMIT: every row, in any order; one WHERE term or none.
		"SELECT id, name FROM items i WHERE i.category = $1": `limit 0/$0 offset $0 sort -1 keys $2: ` +
			"SELECT id, name FROM (SELECT id, name, category FROM items WHERE id = ANY($2) OFFSET 0) i WHERE i.category = $1 wide $0: ",
		// In a join (a subquery too); every column read (no subquery: the
		// WHERE narrows).
		"SELECT i.id, i.name FROM users u JOIN items i ON i.seller = u.id WHERE i.category = $1 AND u.region = $2": `limit 0/$0 offset $0 sort -1 keys $3: ` +
			"SELECT i.id, i.name FROM users u JOIN (SELECT id, name, category, seller FROM items WHERE id = ANY($3) OFFSET 0) i ON i.seller = u.id WHERE i.category = $1 AND u.region = $2 wide $0: ",
		"SELECT * FROM items WHERE category = $1": `limit 0/$0 offset $0 sort -1 keys $2: ` +
			"SELECT * FROM items WHERE category = $1 AND items.id = ANY($2) wide $0: ",
		"SELECT id, name FROM items WHERE category = $1 OR qty > 3": `limit 0/$0 offset $0 sort -1 keys $2: ` +
			"SELECT id, name FROM (SELECT id, name, category, qty FROM items WHERE id = ANY($2) OFFSET 0) items WHERE category = $1 OR qty > 3 wide $0: ",
		// Not: the sort column not shown, descending, two sort columns,
		// NULLS FIRST, no ORDER BY with a LIMIT, a literal offset, WITH
		// TIES.
		"SELECT id, name FROM items WHERE category = $1 ORDER BY end_date LIMIT 20":                                "",
		"SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date DESC LIMIT 20":                 "",
		"SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date, id LIMIT 20":                  "",
		"SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date NULLS FIRST LIMIT 20":          "",
		"SELECT id, name, end_date FROM items WHERE category = $1 LIMIT 20":                                        "",
		"SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date LIMIT 20 OFFSET 20":            "",
		"SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date FETCH FIRST 20 ROWS WITH TIES": "",
		// A LIMIT parameter read elsewhere too.
		"SELECT id, name, end_date FROM items WHERE category = $1 AND qty < $2 ORDER BY end_date LIMIT $2": "",
	} {
		tpl := prepare(t, sql)
		got := ""
		for _, d := range tpl.Deps {
			if d.Rows != nil && d.Rows.Repair != nil {
				r := d.Rows.Repair
				got = fmt.Sprintf("limit %d/$%d offset $%d sort %d keys $%d: %s wide $%d: %s", r.Limit, r.LimitParam, r.Offset, r.SortOutput, r.KeyParam, r.SQL, r.WideParam, r.Wide)
			}
		}
		if got != want {
			t.Errorf("%s\n  repair %q\n  want   %q", sql, got, want)
		}
	}
}
