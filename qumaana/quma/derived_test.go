package quma

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// regionSearch is RUBiS's search of the items of a category sold in a region.
const regionSearch = "SELECT items.id, items.name, items.price FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND items.end_date >= $3 ORDER BY items.end_date LIMIT 20 OFFSET $4"

// derivedAnalyzer analyzes sqls as a workload against testSchema and returns
// the solution and its analyzer.
func derivedAnalyzer(t *testing.T, sqls ...string) (*Solution, *Analyzer) {
	t.Helper()
	var work []Statement
	for _, s := range sqls {
		work = append(work, Statement{SQL: s})
	}
	sol, err := AnalyzeWorkload(mustDDL(t, testSchema), work)
	if err != nil {
		t.Fatal(err)
	}
	return sol, sol.Analyzer()
}

func tagNames(qs []QueryTag) string {
	var parts []string
	for _, q := range qs {
		parts = append(parts, q.String())
	}
	return strings.Join(parts, " ")
}

func mustTags(t *testing.T, tpl *Template, params ...any) []QueryTag {
	t.Helper()
	qtags, err := tpl.Tags(params)
	if err != nil {
		t.Fatal(err)
	}
	return qtags
}

const derivedSet = `public.items(category,"seller->public.users.region")`

func TestDerivedRegionSearch(t *testing.T) {
	sol, an := derivedAnalyzer(t, regionSearch, "SELECT id, name FROM items WHERE id = $1")
	if got := sol.Tables["public.items"].TagColumns; !slices.ContainsFunc(got, func(s []string) bool {
		return slices.Equal(s, []string{"category", "seller->public.users.region"})
	}) {
		t.Fatalf("items' tag columns %v, want (category, seller->public.users.region)", got)
	}
	tpl, err := an.Prepare(regionSearch)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := depText(tpl), `public.items(category,seller->public.users.region)=$1,$2[category,end_date,id,name,price,seller] public.users(region)=$2[id,region]`; got != want {
		t.Errorf("deps %s, want %s", got, want)
	}
	if tpl.Deps[0].CoveredBy != 0 || tpl.Deps[1].CoveredBy != 1 {
		t.Errorf("CoveredBy %d %d, want users covered by items", tpl.Deps[0].CoveredBy, tpl.Deps[1].CoveredBy)
	}
	// One keyed tag and the set's tag; users holds none.
	qtags := mustTags(t, tpl, 7, int64(2), "2026-01-01", 0)
	if got, want := tagNames(qtags), derivedSet+"=(7,2) "+derivedSet+"="; got != want {
		t.Errorf("tags %s, want %s", got, want)
	}
	// Split by rows: the membership tags stay, the set's tag among them.
	if got := splitText(tpl); got != "public.items:0=id[category,end_date,id,seller|name,price]" {
		t.Errorf("split %q", got)
	}
	split, ok := tpl.SplitRows(qtags, 2, func(*RowSplit) ([]int64, bool) { return []int64{4, 9}, true })
	var parts []string
	for _, q := range split {
		parts = append(parts, q.String()+"["+strings.Join(q.Reads, ",")+"]")
	}
	want := derivedSet + "=(7,2)[category,end_date,id,seller] " + derivedSet + "=[category,end_date,id,seller] public.items(id)=4[name,price] public.items(id)=9[name,price]"
	if got := strings.Join(parts, " "); !ok || got != want {
		t.Errorf("split %v\n  %s\nwant\n  %s", ok, got, want)
	}
	// The QUMA file says so.
	var q QueryEntry
	for _, e := range sol.Queries {
		if e.ID == tpl.ID {
			q = e
		}
	}
	var texts []string
	for _, e := range q.Tags {
		texts = append(texts, tagText(e))
	}
	if got, want := strings.Join(texts, " "), "public.items(category,seller->public.users.region)=$1,$2[category,end_date,id,name,price,seller] public.items(category,seller->public.users.region)=[category,end_date,id,name,price,seller] public.users(region)=$2[id,region]{covered}"; got != want {
		t.Errorf("file tags %s, want %s", got, want)
	}
	if !q.Tags[1].Set || q.Tags[2].CoveredBy != derivedSet {
		t.Errorf("file tags %+v: want the second the set's, the third covered by %s", q.Tags, derivedSet)
	}
}

// A dependency keyed on a derived set that falls back takes the template
// back to what it was without derived columns: the table tag of items, and
// users' own dependency.
func TestDerivedFallback(t *testing.T) {
	_, an := derivedAnalyzer(t, regionSearch)
	tpl, err := an.Prepare(regionSearch)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		params []any
		want   string
	}{
		{[]any{nil, 2, "x", 0}, "public.items public.users(region)=2"},
		{[]any{7, nil, "x", 0}, "public.items public.users"},
		{[]any{7, 1 << 40, "x", 0}, "public.items public.users"},
	} {
		if got := tagNames(mustTags(t, tpl, c.params...)); got != c.want {
			t.Errorf("%v: tags %s, want %s", c.params, got, c.want)
		}
	}
}

// Writes to users that can change a region search are reported as
// affecting it; one to a column it does not read is not.
func TestDerivedMayAffect(t *testing.T) {
	_, an := derivedAnalyzer(t, regionSearch)
	q, _ := an.Prepare(regionSearch)
	for w, want := range map[string]bool{
		"UPDATE users SET region = $1 WHERE id = $2":                                  true,
		"UPDATE users SET id = $1 WHERE id = $2":                                      true,
		"INSERT INTO users (id, nickname, region) VALUES ($1, $2, $3)":                true,
		"DELETE FROM users WHERE id = $1":                                             true,
		"UPDATE items SET seller = $1 WHERE id = $2":                                  true,
		"UPDATE users SET rating = $1 WHERE id = $2":                                  false,
		"UPDATE comments SET rating = $1 WHERE id = $2":                               false,
		"WITH x AS (UPDATE users SET region = 1 RETURNING id) SELECT count(*) FROM x": true,
	} {
		wt, err := an.Prepare(w)
		if err != nil {
			t.Fatal(err)
		}
		if got := MayAffect(wt, q); got != want {
			t.Errorf("MayAffect(%s) = %v, want %v", w, got, want)
		}
	}
	// A write to the referenced table's column, even without the covered
	// dependency (a defensive rule).
	d := Dep{Table: "public.items", KeyColumns: []string{"category", "seller->public.users.region"}}
	if !MayAffect(&Template{Writes: []Write{{Table: "public.users", Columns: []string{"region"}}}}, &Template{Deps: []Dep{d}}) {
		t.Error("a write of users.region does not affect a dependency keyed on seller->public.users.region")
	}
}

// What derives and what does not.
func TestDerivedBindings(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		// Reading another users column keeps users' dependency.
		{"SELECT items.id, items.name, users.nickname FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2",
			"public.items(category,seller->public.users.region)=$1,$2[category,id,name,seller] public.users(region)=$2[id,nickname,region]"},
		// So does a predicate on another users column.
		{"SELECT items.name FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND users.rating > $3",
			"public.items(category,seller->public.users.region)=$1,$2[category,name,seller] public.users(region)=$2[id,rating,region]"},
		// A JOIN ... ON and the region alone; a count reads no column of users but the key.
		{"SELECT count(*) FROM items i JOIN users u ON u.id = i.seller WHERE u.region = $1",
			"public.items(seller->public.users.region)=$1[seller] public.users(region)=$1[id,region]{covered}"},
		// A unique column of users works the same.
		{"SELECT i.name FROM items i JOIN users u ON i.seller = u.id WHERE u.nickname = $1",
			"public.items(seller->public.users.nickname)=$1[name,seller] public.users(nickname)=$1[id,nickname]{covered}"},
		// A LEFT JOIN's nullable side does not derive.
		{"SELECT i.name FROM items i LEFT JOIN users u ON i.seller = u.id AND u.region = $2 WHERE i.category = $1",
			"public.items(category)=$1[category,name,seller] public.users(region)=$2[id,region]"},
		// Nor a join on a column that is not users' primary key.
		{"SELECT items.name FROM items, users WHERE items.category = $1 AND items.seller = users.rating AND users.region = $2",
			"public.items(category)=$1[category,name,seller] public.users(region)=$2[rating,region]"},
		// Nor a foreign key bound to values itself: the plain keys serve.
		{"SELECT items.name FROM items, users WHERE items.seller = users.id AND users.id = $1 AND users.region = $2",
			"public.items(seller)=$1[name,seller] public.users(id)=$1[id,region]"},
		// Nor a NULL, nor a column without a canonical text form.
		{"SELECT items.name FROM items, users WHERE items.seller = users.id AND users.region = NULL",
			"public.items[name,seller] public.users[id,region]"},
		{"SELECT items.name FROM items, users WHERE items.seller = users.id AND users.balance = $1",
			"public.items[name,seller] public.users[balance,id]"},
		// Nor across scopes.
		{"SELECT name FROM items WHERE seller IN (SELECT id FROM users WHERE region = $1)",
			"public.items[name,seller] public.users(region)=$1[id,region]"},
	} {
		_, an := derivedAnalyzer(t, c.sql)
		tpl, err := an.Prepare(c.sql)
		if err != nil || !tpl.Cacheable {
			t.Fatalf("%s: %v %s", c.sql, err, tpl.Reason)
		}
		if got := coveredDepText(tpl); got != c.want {
			t.Errorf("%s\n  got  %s\n  want %s", c.sql, got, c.want)
		}
	}
}

// coveredDepText is depText with covered dependencies marked.
func coveredDepText(tpl *Template) string {
	parts := strings.Split(depText(tpl), " ")
	for i, d := range tpl.Deps {
		if d.CoveredBy > 0 {
			parts[i] += "{covered}"
		}
	}
	return strings.Join(parts, " ")
}

// A reference that covers another is never itself covered: its tags are
// what the covered one's changes are published to.
func TestDerivedCoverageChains(t *testing.T) {
	s := mustDDL(t, `
CREATE TABLE users (id int PRIMARY KEY, region int);
CREATE TABLE profiles (user_id int PRIMARY KEY, bio text);
CREATE TABLE items (id int PRIMARY KEY, seller int, name text);
`)
	sql := "SELECT i.name FROM profiles p, items i, users u WHERE i.seller = p.user_id AND p.user_id = u.id AND u.region = $1 AND p.bio = $2"
	sol, err := AnalyzeWorkload(s, []Statement{{SQL: sql}})
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := sol.Analyzer().Prepare(sql)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range tpl.Deps {
		if d.CoveredBy > 0 && tpl.Deps[d.CoveredBy-1].CoveredBy > 0 {
			t.Errorf("%s is covered by %s, which is covered itself (%s)", d.Table, tpl.Deps[d.CoveredBy-1].Table, coveredDepText(tpl))
		}
		if d.CoveredBy == i+1 {
			t.Errorf("%s covers itself", d.Table)
		}
	}
	// Tags: every table whose changes reach the result through a tag held.
	got := tagNames(mustTags(t, tpl, 2, "b"))
	for _, want := range []string{`public.items("seller->public.profiles.bio","seller->public.users.region")=(b,2)`, `public.profiles(bio,"user_id->public.users.region")=(b,2)`} {
		if !strings.Contains(got, want) {
			t.Errorf("tags %s, want %s among them (%s)", got, want, coveredDepText(tpl))
		}
	}
}

func TestDerivedSolutionRoundTrip(t *testing.T) {
	sol, _ := derivedAnalyzer(t, regionSearch)
	var js bytes.Buffer
	if err := sol.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	back, err := ReadSolution(bytes.NewReader(js.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var js2 bytes.Buffer
	if err := back.WriteJSON(&js2); err != nil {
		t.Fatal(err)
	}
	if js.String() != js2.String() {
		t.Errorf("the QUMA file does not round-trip:\n%s\n---\n%s", js.String(), js2.String())
	}
	tpl, err := back.Analyzer().Prepare(regionSearch)
	if err != nil {
		t.Fatal(err)
	}
	if got := tagNames(mustTags(t, tpl, 7, 2, "x", 0)); got != derivedSet+"=(7,2) "+derivedSet+"=" {
		t.Errorf("tags from the file's analyzer: %s", got)
	}
	// Its replica identity warning names the foreign key's set.
	if !slices.ContainsFunc(back.Warnings, func(w string) bool {
		return strings.Contains(w, "table public.items") && strings.Contains(w, "(category,seller->public.users.region)")
	}) {
		t.Errorf("warnings %v: want items' identity warning to name the derived set", back.Warnings)
	}
	// A write to users publishes the derived set (the tags of the items it sells).
	sol2, _ := derivedAnalyzer(t, regionSearch, "UPDATE users SET region = $1 WHERE id = $2")
	if len(sol2.Writes) != 1 || !slices.Contains(sol2.Writes[0].Publishes, derivedSet) {
		t.Errorf("UPDATE users publishes %v, want %s among them", sol2.Writes, derivedSet)
	}
}

func TestReadSolutionDerivedErrors(t *testing.T) {
	sol, _ := derivedAnalyzer(t, "SELECT name FROM items WHERE id = $1")
	s := mustDDL(t, testSchema+`
CREATE TABLE pairs (a int, b int, tag text, PRIMARY KEY (a, b));
CREATE TABLE things (id int8 PRIMARY KEY, tag text);
`)
	for col, want := range map[string]string{
		"seller->public.users.region":   "",
		"seller->public.nowhere.region": "referenced table public.nowhere is not in the schema",
		"nothing->public.users.region":  `foreign key column "nothing" does not exist`,
		"seller->public.users.missing":  `column "missing" of public.users does not exist`,
		"seller->public.users.balance":  "type float4, which cannot carry keyed tags",
		"seller->public.pairs.tag":      "no single-column primary key",
		"seller->public.things.tag":     "foreign key seller has type int4, the primary key id of public.things has type int8",
	} {
		sol.Schema = s
		sol.Tables = map[string]*TableEntry{"public.items": {TagColumns: [][]string{{"category", col}}}}
		var js bytes.Buffer
		if err := json.NewEncoder(&js).Encode(sol); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSolution(&js)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", col, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want it to say %q", col, err, want)
		}
	}
}
