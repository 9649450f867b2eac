package quma

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func mustDDL(tb testing.TB, ddl string) *Schema {
	tb.Helper()
	s, err := LoadDDL(ddl)
	if err != nil {
		tb.Fatalf("LoadDDL: %v", err)
	}
	return s
}

func mustFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// testSchema is a small shop: keyable and non-keyable columns, a view, a
// unique key, a temporary table and one immutable user function.
const testSchema = `
CREATE TABLE users (id int PRIMARY KEY, nickname varchar(20) NOT NULL UNIQUE, password varchar(20), region int, rating int, balance real);
CREATE TABLE items (id int PRIMARY KEY, name text, category int, seller int, price real, end_date timestamp, code char(4), qty int);
CREATE TABLE comments (id int PRIMARY KEY, to_user_id int, from_user_id int, rating int, body text);
CREATE TEMP TABLE scratch (id int);
CREATE VIEW cheap AS SELECT id, name FROM items WHERE price < 10;
CREATE FUNCTION slug(text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT lower($1)';
CREATE FUNCTION total_bids(int) RETURNS int STABLE LANGUAGE sql AS 'SELECT 1';
`

var testSets = map[string][][]string{
	"public.users":    {{"id"}, {"nickname"}, {"region"}},
	"public.items":    {{"id"}, {"category"}, {"seller"}, {"name"}},
	"public.comments": {{"to_user_id"}, {"rating"}},
}

func prepare(t *testing.T, sql string) *Template {
	t.Helper()
	tpl, err := NewAnalyzer(mustDDL(t, testSchema), testSets).Prepare(sql)
	if err != nil {
		t.Fatalf("Prepare(%q): %v", sql, err)
	}
	return tpl
}

// depText renders dependencies compactly: table(cols)=vals[reads] or table[reads].
func depText(t *Template) string {
	var parts []string
	for _, d := range t.Deps {
		s := d.Table
		if len(d.KeyColumns) > 0 {
			var vals []string
			for _, alts := range d.Values() {
				vals = append(vals, strings.Join(alts, "|"))
			}
			s += "(" + strings.Join(d.KeyColumns, ",") + ")=" + strings.Join(vals, ",")
		}
		if d.AllColumns {
			s += "[*]"
		} else {
			s += "[" + strings.Join(d.Reads, ",") + "]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func TestReadTags(t *testing.T) {
	cases := []struct{ sql, want string }{
		{"SELECT * FROM items WHERE id = $1", "public.items(id)=$1[*]"},
		{"SELECT name FROM items WHERE $1 = id", "public.items(id)=$1[id,name]"},
		{"SELECT name FROM items WHERE id IN ($1, $2, 7)", "public.items(id)=$1|$2|7[id,name]"},
		{"SELECT name FROM items WHERE id = ANY($1)", "public.items(id)=$1[][id,name]"},
		{"SELECT name FROM items WHERE id = ANY($1::int[])", "public.items(id)=$1[][id,name]"},
		{"SELECT name FROM items WHERE id = 42", "public.items(id)=42[id,name]"},
		{"SELECT i.name FROM items i WHERE i.id = $1::int8", "public.items(id)=$1[id,name]"},
		// join closure: items.seller = users.id AND users.id = $1 fixes items.seller
		{"SELECT items.name FROM items, users WHERE items.seller = users.id AND users.id = $1",
			"public.items(seller)=$1[name,seller] public.users(id)=$1[id]"},
		{"SELECT i.name FROM items i JOIN users u ON i.seller = u.id WHERE u.nickname = $1",
			"public.items[name,seller] public.users(nickname)=$1[id,nickname]"},
		{"SELECT i.name FROM items i JOIN users u USING (id) WHERE u.id = $1",
			"public.items(id)=$1[id,name] public.users(id)=$1[id]"},
		// fallbacks
		{"SELECT name FROM items WHERE id = $1 OR category = $2", "public.items[category,id,name]"},
		{"SELECT name FROM items WHERE id > $1", "public.items[id,name]"},
		{"SELECT name FROM items WHERE name LIKE $1", "public.items[name]"},
		{"SELECT name FROM items WHERE lower(name) = $1", "public.items[name]"},
		{"SELECT name FROM items WHERE id::text = $1", "public.items[id,name]"},
		{"SELECT name FROM items WHERE code = $1", "public.items[code,name]"},        // bpchar: padding semantics
		{"SELECT name FROM items WHERE price = $1", "public.items[name,price]"},      // float: no canonical text
		{"SELECT name FROM items WHERE name = $1::bpchar", "public.items[name]"},     // comparison in bpchar
		{"SELECT name FROM items WHERE name = $1::varchar(3)", "public.items[name]"}, // truncating cast
		{"SELECT name FROM items WHERE id = NULL", "public.items[id,name]"},          // never true: no key
		{"SELECT count(*) FROM items", "public.items[]"},                             // reads no column, rows only
		{"SELECT t FROM items t WHERE t.id = $1", "public.items(id)=$1[*]"},          // whole-row use
		{"SELECT name, qty FROM items WHERE category = $1 AND qty < $2", "public.items(category)=$1[category,name,qty]"},
		// outer joins: ON binds only the nullable side
		{"SELECT u.nickname, c.body FROM users u LEFT JOIN comments c ON c.to_user_id = u.id AND c.rating = $2 WHERE u.id = $1",
			"public.users(id)=$1[id,nickname] public.comments(rating)=$2[body,rating,to_user_id]"},
		{"SELECT u.nickname FROM users u LEFT JOIN comments c ON u.id = $1", "public.users[id,nickname] public.comments[]"},
		{"SELECT u.nickname FROM users u FULL JOIN comments c ON c.to_user_id = $1", "public.users[nickname] public.comments[to_user_id]"},
		// subqueries are scopes of their own
		{"SELECT name FROM items WHERE seller IN (SELECT id FROM users WHERE region = $1)",
			"public.items[name,seller] public.users(region)=$1[id,region]"},
		{"SELECT name FROM items i WHERE EXISTS (SELECT 1 FROM comments c WHERE c.to_user_id = i.seller AND c.rating = $1)",
			"public.items[name,seller] public.comments(rating)=$1[rating,to_user_id]"},
		{"SELECT * FROM (SELECT id, name FROM items WHERE category = $1) s WHERE s.id = $2", "public.items(category)=$1[category,id,name]"},
		{"WITH s AS (SELECT id FROM users WHERE nickname = $1) SELECT name FROM items, s WHERE items.seller = s.id",
			"public.users(nickname)=$1[id,nickname] public.items[name,seller]"},
		{"SELECT id FROM users WHERE id = $1 UNION SELECT seller FROM items WHERE category = $2",
			"public.users(id)=$1[id] public.items(category)=$2[category,seller]"},
		// views expand to their base tables
		{"SELECT name FROM cheap WHERE id = $1", "public.items[id,name,price]"},
		// a self-join is two references
		{"SELECT a.name FROM items a, items b WHERE a.id = $1 AND b.category = a.category",
			"public.items(id)=$1[category,id,name] public.items[category]"},
		// a user function declared immutable is fine
		{"SELECT slug(name) FROM items WHERE id = $1", "public.items(id)=$1[id,name]"},
	}
	for _, c := range cases {
		tpl := prepare(t, c.sql)
		if !tpl.Cacheable {
			t.Errorf("%s: not cacheable: %s", c.sql, tpl.Reason)
			continue
		}
		if got := depText(tpl); got != c.want {
			t.Errorf("%s\n  got  %s\n  want %s", c.sql, got, c.want)
		}
	}
}

func TestFallbackReasons(t *testing.T) {
	cases := []struct{ sql, reason string }{
		{"SELECT name FROM items WHERE id = $1 OR category = $2", "OR"},
		{"SELECT name FROM items WHERE id > $1", "range"},
		{"SELECT name FROM items WHERE name LIKE $1", "pattern match"},
		{"SELECT name FROM items WHERE price = $1", "canonical text form"},
		{"SELECT name FROM items", "no predicate"},
		{"SELECT name FROM cheap WHERE id = $1", "view public.cheap"},
		{"SELECT name FROM items WHERE qty = $1", "not a tag column set"},
	}
	for _, c := range cases {
		tpl := prepare(t, c.sql)
		if len(tpl.Deps) == 0 || !strings.Contains(tpl.Deps[0].Reason, c.reason) {
			t.Errorf("%s: reason %q, want it to mention %q", c.sql, tpl.Deps[0].Reason, c.reason)
		}
	}
}

func TestCacheability(t *testing.T) {
	cases := []struct {
		sql, reason string
		rewrite     bool
	}{
		{"SELECT * FROM items WHERE end_date >= 'now'::timestamp", "clock", true},
		{"SELECT * FROM items WHERE end_date >= CURRENT_TIMESTAMP(3)", "clock", true},
		{"SELECT * FROM items WHERE end_date >= clock_timestamp()", "clock", true},
		{"SELECT * FROM items WHERE end_date >= statement_timestamp()", "clock", true},
		{"SELECT random(), id FROM items", "volatile", false},
		{"SELECT nextval('s')", "volatile", false},
		{"SELECT * FROM items WHERE id = $1 FOR UPDATE", "FOR UPDATE", false},
		{"SELECT * FROM items WHERE id = $1 FOR SHARE", "FOR UPDATE/SHARE", false},
		{"SELECT 1; SELECT 2", "2 statements", false},
		{"SELECT * FROM scratch", "temporary", false},
		{"SELECT * FROM pg_temp.whatever", "temporary", false},
		{"SELECT * FROM nowhere", "unknown table", false},
		{"SELECT total_bids(id) FROM items", "not immutable", false},
		{"SELECT mystery(id) FROM items", "not known to be immutable", false},
		{"SELECT * INTO copy FROM items", "SELECT INTO", false},
		{"WITH d AS (DELETE FROM items RETURNING id) SELECT * FROM d", "writes", false},
		{"UPDATE items SET qty = 1", "writes", false},
		{"CREATE TABLE x (id int)", "not a query", false},
	}
	for _, c := range cases {
		tpl := prepare(t, c.sql)
		if tpl.Cacheable || !strings.Contains(tpl.Reason, c.reason) {
			t.Errorf("%s: cacheable=%v reason %q; want not cacheable because %q", c.sql, tpl.Cacheable, tpl.Reason, c.reason)
		}
		if (tpl.Rewrite != "") != c.rewrite {
			t.Errorf("%s: rewrite %q", c.sql, tpl.Rewrite)
		}
	}
}

func TestWrites(t *testing.T) {
	cases := []struct{ sql, want string }{
		{"INSERT INTO items (id) VALUES ($1)", "public.items:*"},
		{"UPDATE items SET qty = $1, name = $2 WHERE id = $3", "public.items:name,qty"},
		{"DELETE FROM comments WHERE id = $1", "public.comments:*"},
		{"TRUNCATE items, users", "public.items:truncate public.users:truncate"},
		{"WITH x AS (UPDATE users SET rating = 1 RETURNING id) SELECT * FROM x", "public.users:rating"},
	}
	for _, c := range cases {
		tpl := prepare(t, c.sql)
		var parts []string
		for _, w := range tpl.Writes {
			switch {
			case w.Truncate:
				parts = append(parts, w.Table+":truncate")
			case w.AllColumns:
				parts = append(parts, w.Table+":*")
			default:
				parts = append(parts, w.Table+":"+strings.Join(w.Columns, ","))
			}
		}
		if got := strings.Join(parts, " "); got != c.want || tpl.Kind != KindWrite {
			t.Errorf("%s: writes %q kind %s, want %q", c.sql, got, tpl.Kind, c.want)
		}
	}
}

func TestTagsInstantiate(t *testing.T) {
	tpl := prepare(t, "SELECT name FROM items WHERE id IN ($1, $2) AND category = $3")
	got, err := tpl.Tags([]any{int64(7), "042", 3})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range got {
		names = append(names, g.String())
	}
	// category (one value) is preferred over id (two values)
	if want := "public.items(category)=3"; strings.Join(names, " ") != want {
		t.Errorf("tags %v, want %s", names, want)
	}

	tpl = prepare(t, "SELECT name FROM items WHERE id = ANY($1)")
	got, err = tpl.Tags([]any{[]int32{5, 6, 5}})
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, g := range got {
		names = append(names, g.String())
	}
	if want := "public.items(id)=5 public.items(id)=6"; strings.Join(names, " ") != want {
		t.Errorf("tags %v, want %s", names, want)
	}

	// Values that cannot be made canonical fall back to the table tag.
	tpl = prepare(t, "SELECT name FROM items WHERE id = $1")
	for _, bad := range []any{nil, "4x2", 4.5, struct{}{}, int64(1) << 40} {
		got, err := tpl.Tags([]any{bad})
		if err != nil || len(got) != 1 || !got[0].IsTable() {
			t.Errorf("param %#v: tags %v err %v; want the table tag", bad, got, err)
		}
	}
	if _, err := tpl.Tags(nil); err == nil {
		t.Error("missing parameter: no error")
	}
	var pe *ParamError
	if _, err := tpl.Tags(nil); !errors.As(err, &pe) || pe.Param != 1 {
		t.Errorf("missing parameter: %v", err)
	}
	uc := prepare(t, "SELECT clock_timestamp()")
	if _, err := uc.Tags(nil); !errors.Is(err, ErrNotCacheable) {
		t.Errorf("uncacheable: %v", err)
	}
	// text and uuid canonical forms
	if s, ok := canonical("uuid", "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}"); !ok || s != "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" {
		t.Errorf("uuid canonical %q %v", s, ok)
	}
	if s, ok := canonical("bool", "yes"); !ok || s != "t" {
		t.Errorf("bool canonical %q %v", s, ok)
	}
	if _, ok := canonical("text", "a\x00b"); ok {
		t.Error("text with NUL accepted")
	}
}

func TestSyntaxErrorPosition(t *testing.T) {
	_, err := NewAnalyzer(nil, nil).Prepare("SELECT *\nFROM items\nWHERE id = = 1")
	var se *SyntaxError
	if !errors.As(err, &se) || se.Line != 3 || se.Column != 12 {
		t.Fatalf("err = %#v, want a syntax error at line 3 column 12", err)
	}
	if _, err := NewAnalyzer(nil, nil).Prepare("  -- nothing\n"); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
}

func TestPrepareCachesTemplates(t *testing.T) {
	a := NewAnalyzer(mustDDL(t, testSchema), testSets)
	t1, _ := a.Prepare("SELECT name FROM items WHERE id = $1")
	t2, _ := a.Prepare("SELECT name FROM items WHERE id = $1")
	t3, _ := a.Prepare("SELECT name FROM items WHERE id = 5")
	if t1 != t2 {
		t.Error("same text analyzed twice")
	}
	if t1.ID != t3.ID {
		t.Errorf("fingerprints differ for one template: %s %s", t1.ID, t3.ID)
	}
}

// TestInventoryFigure3 checks Ferdinand's inventory example against the
// substance of the paper's Figure 3.
func TestInventoryFigure3(t *testing.T) {
	schema := mustDDL(t, mustFile(t, "../testdata/inventory/schema.sql"))
	work, err := ReadTemplates(strings.NewReader(mustFile(t, "../testdata/inventory/templates.sql")), "templates.sql")
	if err != nil {
		t.Fatal(err)
	}
	sol, err := AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	if len(sol.Queries) != 3 || len(sol.Writes) != 2 {
		t.Fatalf("%d queries, %d writes", len(sol.Queries), len(sol.Writes))
	}
	q3, q4, q5 := sol.Queries[0], sol.Queries[1], sol.Queries[2]
	if len(q3.Tags) != 1 || strings.Join(q3.Tags[0].Columns, ",") != "name" || q3.Tags[0].Values[0] != "$1" {
		t.Errorf("Q3 tags %+v, want keyed on name", q3.Tags)
	}
	for _, q := range []QueryEntry{q4, q5} {
		if len(q.Tags) != 1 || len(q.Tags[0].Columns) != 0 {
			t.Errorf("%s: tags %+v, want the table tag", q.SQL, q.Tags)
		}
	}
	u1, u2 := sol.Writes[0], sol.Writes[1]
	if strings.Join(u1.Affects, ",") != strings.Join([]string{q3.ID, q4.ID, q5.ID}, ",") {
		t.Errorf("U1 affects %v", u1.Affects)
	}
	if strings.Join(u2.Affects, ",") != q3.ID+","+q5.ID || strings.Join(u2.Independent, ",") != q4.ID {
		t.Errorf("U2 affects %v, independent of %v; want Q3, Q5 and not Q4", u2.Affects, u2.Independent)
	}
	if got := sol.Tables["public.inv"].TagColumns; len(got) != 1 || got[0][0] != "name" {
		t.Errorf("tag columns %v", got)
	}
	if want := "public.inv(name)"; !strings.Contains(strings.Join(u2.Publishes, " "), want) {
		t.Errorf("U2 publishes %v, want %s", u2.Publishes, want)
	}
}

// Reads of the transaction's start are cacheable: ClockSQL replaces each
// by the next parameter, cast to the read's type, and keeps the rest.
func TestClockBoundQueries(t *testing.T) {
	cases := []struct{ sql, want string }{
		{"SELECT * FROM items WHERE end_date >= now()", "end_date >= $1::timestamptz"},
		{"SELECT * FROM items WHERE end_date >= CURRENT_TIMESTAMP AND id = $1", "end_date >= $2::timestamptz AND id = $1"},
		{"SELECT * FROM items WHERE end_date >= current_date", "end_date >= $1::timestamptz::date"},
		{"SELECT localtimestamp, localtime, current_time, transaction_timestamp(), pg_catalog.now() FROM items WHERE id = $2",
			`$3::timestamptz::timestamp AS "localtimestamp", $3::timestamptz::time AS "localtime", $3::timestamptz::timetz AS "current_time", $3::timestamptz AS transaction_timestamp, $3::timestamptz AS now`},
		{"SELECT id FROM items WHERE end_date > now() - interval '1 day' ORDER BY end_date", "end_date > ($1::timestamptz - '1 day'::interval)"},
	}
	for _, c := range cases {
		tpl := prepare(t, c.sql)
		if !tpl.Cacheable {
			t.Errorf("%s: not cacheable: %s", c.sql, tpl.Reason)
			continue
		}
		got := strings.NewReplacer("pg_catalog.", "", "timestamp with time zone", "timestamptz", "time with time zone", "timetz").Replace(tpl.ClockSQL)
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: ClockSQL %q, want it to hold %q", c.sql, tpl.ClockSQL, c.want)
		}
	}
	if tpl := prepare(t, "SELECT name FROM items WHERE id = $1"); tpl.ClockSQL != "" {
		t.Errorf("a query without clock reads has ClockSQL %q", tpl.ClockSQL)
	}
	// A user function named now, in another schema, is not the clock.
	if tpl := prepare(t, "SELECT * FROM items WHERE end_date >= other.now()"); tpl.ClockSQL != "" {
		t.Errorf("other.now(): ClockSQL %q", tpl.ClockSQL)
	}
}

// A view's body counts as the statement's own: a view reading the clock,
// random() or a function not known immutable is not cacheable.
func TestViewBodiesAreChecked(t *testing.T) {
	s := mustDDL(t, `
CREATE TABLE items (id int PRIMARY KEY, name text, end_date timestamptz);
CREATE FUNCTION bids_of(int) RETURNS int STABLE LANGUAGE sql AS 'SELECT 1';
CREATE VIEW live AS SELECT id, name FROM items WHERE end_date > now();
CREATE VIEW rnd AS SELECT id, random() AS r FROM items;
CREATE VIEW withbids AS SELECT id, bids_of(id) AS n FROM items;
CREATE VIEW plain AS SELECT id, name FROM items;
`)
	a := NewAnalyzer(s, map[string][][]string{"public.items": {{"id"}}})
	for q, want := range map[string]string{"SELECT id FROM live": "clock", "SELECT * FROM rnd": "volatile", "SELECT * FROM withbids": "not immutable"} {
		tpl, err := a.Prepare(q)
		if err != nil {
			t.Fatal(err)
		}
		if tpl.Cacheable || !strings.Contains(tpl.Reason, want) {
			t.Errorf("%q: cacheable %v, reason %q; want not cacheable (%s)", q, tpl.Cacheable, tpl.Reason, want)
		}
	}
	if tpl, err := a.Prepare("SELECT * FROM plain"); err != nil || !tpl.Cacheable {
		t.Errorf("a view of plain columns: %+v, %v", tpl, err)
	}
}

// The clock rewrite keeps result columns' names (now, current_date), and
// a clock read in FROM or shadowed by a user function now() is not
// rewritten.
func TestClockRewriteKeepsTheResultShape(t *testing.T) {
	a := NewAnalyzer(mustDDL(t, `CREATE TABLE items (id int PRIMARY KEY);`), nil)
	for q, want := range map[string]string{
		"SELECT now()":                    "AS now",
		"SELECT CURRENT_DATE":             `AS "current_date"`,
		"SELECT now() AS t":               "AS t",
		"SELECT now() + interval '1 day'": "", // PostgreSQL names it ?column? either way
	} {
		tpl, err := a.Prepare(q)
		if err != nil || tpl.ClockSQL == "" {
			t.Fatalf("%q: %+v, %v", q, tpl, err)
		}
		if want != "" && !strings.Contains(tpl.ClockSQL, want) {
			t.Errorf("%q rewritten to %q: want %s", q, tpl.ClockSQL, want)
		}
	}
	if tpl, err := a.Prepare("SELECT * FROM now()"); err != nil || tpl.Cacheable {
		t.Errorf("SELECT * FROM now(): cacheable %v (%v); want it refused", tpl.Cacheable, err)
	}
	s := mustDDL(t, `CREATE SCHEMA app; CREATE FUNCTION app.now() RETURNS timestamptz IMMUTABLE LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;`)
	s.SearchPath = []string{"app", "pg_catalog", "public"}
	tpl, err := NewAnalyzer(s, nil).Prepare("SELECT now()")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.ClockSQL != "" {
		t.Errorf("app.now() (first on the path) rewritten to the clock bucket: %q", tpl.ClockSQL)
	}
}
