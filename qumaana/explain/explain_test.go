package explain

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/larderdb/larder/qumaana/quma"
)

func rubisSchema(t *testing.T) *quma.Schema {
	t.Helper()
	b, err := os.ReadFile("../testdata/rubis/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	s, err := quma.LoadDDL(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rubisSolution(t *testing.T) *quma.Solution {
	t.Helper()
	f, err := os.Open("../testdata/rubis/quma.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sol, err := quma.ReadSolution(f)
	if err != nil {
		t.Fatal(err)
	}
	return sol
}

func TestStatement(t *testing.T) {
	schema, sol := rubisSchema(t), rubisSolution(t)
	withFile := Options{Schema: schema, Solution: sol}
	alone := Options{Schema: schema}
	cases := []struct {
		name  string
		sql   string
		o     Options
		check func(t *testing.T, r *Report)
	}{
		{"keyed, in the file", "SELECT * FROM items WHERE id = $1", withFile, func(t *testing.T, r *Report) {
			if !r.Cacheable || r.Clock != nil || r.TagSetsFrom != SetsFromQUMA || r.InQUMAFile == nil || !*r.InQUMAFile {
				t.Errorf("cacheable %v, clock %v, sets from %q, in file %v", r.Cacheable, r.Clock, r.TagSetsFrom, r.InQUMAFile)
			}
			if r.Template != "a9016ab64423ac2a" {
				t.Errorf("template %q (testdata/*.prom use a9016ab64423ac2a)", r.Template)
			}
			d := r.Dependencies
			if len(d) != 1 || !slices.Equal(d[0].KeyColumns, []string{"id"}) || !slices.Equal(d[0].Tags, []string{"public.items(id)=$1"}) || !d[0].AllColumns {
				t.Errorf("dependencies %+v", d)
			}
			if len(r.Reads) != 1 || !r.Reads[0].AllColumns {
				t.Errorf("reads %+v", r.Reads)
			}
			if got := r.TagColumnSets["public.items"]; len(got) != 4 { // (category) (id) (seller) (category,seller->public.users.region)
				t.Errorf("items' tag column sets %v", got)
			}
		}},
		{"a join keyed on a derived set", "SELECT items.id, items.name FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2", withFile, func(t *testing.T, r *Report) {
			set := `public.items(category,"seller->public.users.region")`
			var items, users *Dependency
			for i := range r.Dependencies {
				switch r.Dependencies[i].Table {
				case "public.items":
					items = &r.Dependencies[i]
				case "public.users":
					users = &r.Dependencies[i]
				}
			}
			if items == nil || !slices.Equal(items.Tags, []string{set + "=($1,$2)", set + "="}) {
				t.Errorf("items' dependency %+v: want the derived tag and the set tag", items)
			}
			if users == nil || users.CoveredBy != set {
				t.Errorf("users' dependency %+v: want covered by %s", users, set)
			}
			var b strings.Builder
			if err := r.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), "covered by "+set) {
				t.Errorf("the text report does not say users is covered:\n%s", b.String())
			}
		}},
		{"a write to a referenced table publishes the derived set", "UPDATE users SET region = $1 WHERE id = $2", withFile, func(t *testing.T, r *Report) {
			if len(r.Writes) != 1 || !slices.Contains(r.Writes[0].Publishes, `public.items(category,"seller->public.users.region")`) {
				t.Errorf("writes %+v", r.Writes)
			}
		}},
		{"same template, other literal", "SELECT * FROM items WHERE id = 42", withFile, func(t *testing.T, r *Report) {
			if r.Template != "a9016ab64423ac2a" || r.Normalized != "SELECT * FROM items WHERE id = $1" {
				t.Errorf("template %q, normalized %q", r.Template, r.Normalized)
			}
			if !slices.Equal(r.Dependencies[0].Tags, []string{"public.items(id)=42"}) {
				t.Errorf("tags %v", r.Dependencies[0].Tags)
			}
		}},
		{"clock-bound", "SELECT * FROM items WHERE seller = $1 AND end_date >= NOW()", alone, func(t *testing.T, r *Report) {
			if !r.Cacheable || r.Clock == nil || r.Clock.Param != 2 || !strings.Contains(r.Clock.SQL, "$2::timestamp") {
				t.Errorf("cacheable %v, clock %+v", r.Cacheable, r.Clock)
			}
			if r.TagSetsFrom != SetsFromStatement || r.InQUMAFile != nil {
				t.Errorf("sets from %q, in file %v", r.TagSetsFrom, r.InQUMAFile)
			}
			if !slices.Equal(r.Dependencies[0].Tags, []string{"public.items(seller)=$1"}) {
				t.Errorf("tags %v", r.Dependencies[0].Tags)
			}
		}},
		{"uncacheable, with a rewrite", "SELECT * FROM items WHERE end_date >= 'now'::date", alone, func(t *testing.T, r *Report) {
			if r.Cacheable || !strings.Contains(r.Reason, "clock") || r.Rewrite == "" || r.Clock != nil {
				t.Errorf("cacheable %v, reason %q, rewrite %q, clock %v", r.Cacheable, r.Reason, r.Rewrite, r.Clock)
			}
			if d := r.Dependencies; len(d) != 1 || d[0].TableTagReason == "" || !slices.Equal(d[0].Tags, []string{"public.items"}) {
				t.Errorf("dependencies %+v", d)
			}
		}},
		{"locks rows", "SELECT max_bid FROM items WHERE id = $1 FOR UPDATE", withFile, func(t *testing.T, r *Report) {
			if r.Cacheable || !strings.Contains(r.Reason, "FOR UPDATE") {
				t.Errorf("cacheable %v, reason %q", r.Cacheable, r.Reason)
			}
			if len(r.Reads) != 1 || !slices.Equal(r.Reads[0].Columns, []string{"id", "max_bid"}) {
				t.Errorf("reads %+v", r.Reads)
			}
		}},
		{"IN list and a join", "SELECT b.bid, u.nickname FROM bids b JOIN users u ON u.id = b.user_id WHERE b.item_id IN ($1, $2)", withFile, func(t *testing.T, r *Report) {
			if r.InQUMAFile == nil || *r.InQUMAFile {
				t.Errorf("in file %v", r.InQUMAFile)
			}
			var bids, users *Dependency
			for i := range r.Dependencies {
				switch r.Dependencies[i].Table {
				case "public.bids":
					bids = &r.Dependencies[i]
				case "public.users":
					users = &r.Dependencies[i]
				}
			}
			if bids == nil || !slices.Equal(bids.Tags, []string{"public.bids(item_id)=$1", "public.bids(item_id)=$2"}) {
				t.Errorf("bids %+v", bids)
			}
			if users == nil || len(users.KeyColumns) != 0 || users.TableTagReason == "" || !slices.Equal(users.Reads, []string{"id", "nickname"}) {
				t.Errorf("users %+v", users)
			}
		}},
		{"a set the file lacks", "SELECT * FROM comments WHERE from_user_id = $1", withFile, func(t *testing.T, r *Report) {
			d := r.Dependencies
			if len(d) != 1 || len(d[0].KeyColumns) != 0 || len(d[0].Proposed) != 1 || !slices.Equal(d[0].Proposed[0], []string{"from_user_id"}) {
				t.Errorf("dependencies %+v", d)
			}
		}},
		{"the same, without the file", "SELECT * FROM comments WHERE from_user_id = $1", alone, func(t *testing.T, r *Report) {
			d := r.Dependencies
			if len(d) != 1 || !slices.Equal(d[0].KeyColumns, []string{"from_user_id"}) || d[0].Proposed != nil {
				t.Errorf("dependencies %+v", d)
			}
		}},
		{"write", "UPDATE items SET max_bid = $1 WHERE id = $2", withFile, func(t *testing.T, r *Report) {
			if r.Kind != "write" || r.Cacheable || len(r.Writes) != 1 {
				t.Fatalf("kind %q, cacheable %v, writes %+v", r.Kind, r.Cacheable, r.Writes)
			}
			w := r.Writes[0]
			if !slices.Equal(w.Columns, []string{"max_bid"}) || !slices.Equal(w.Publishes, []string{"public.items", "public.items(category)", "public.items(id)", "public.items(seller)", `public.items(category,"seller->public.users.region")`}) {
				t.Errorf("write %+v", w)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Statement(c.sql, c.o)
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, r)
		})
	}
}

func TestStatementErrors(t *testing.T) {
	schema := rubisSchema(t)
	_, err := Statement("SELECT * FROM items WHERE id = = 1", Options{Schema: schema})
	var se *quma.SyntaxError
	if !errors.As(err, &se) || se.Column != 32 {
		t.Errorf("malformed: %v (%+v)", err, se)
	}
	if _, err := Statement("  ", Options{Schema: schema}); !errors.Is(err, quma.ErrEmpty) {
		t.Errorf("empty: %v", err)
	}
	if _, err := Statement("SELECT 1", Options{}); !errors.Is(err, ErrNoSchema) {
		t.Errorf("no schema: %v", err)
	}
}

// A search page splits by rows, and explain says so.
func TestStatementRowSplit(t *testing.T) {
	r, err := Statement("SELECT id, name, max_bid FROM items WHERE category = $1 ORDER BY end_date LIMIT 20", Options{Schema: rubisSchema(t), Solution: rubisSolution(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Dependencies) != 1 {
		t.Fatalf("dependencies %+v", r.Dependencies)
	}
	s := r.Dependencies[0].RowSplit
	if s == nil || s.RowTag != "public.items(id)" || s.Output != 1 ||
		!slices.Equal(s.Membership, []string{"category", "end_date", "id"}) || !slices.Equal(s.Display, []string{"max_bid", "name"}) {
		t.Fatalf("row split %+v", s)
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if want := "split by rows: these tags read only category, end_date, id; each row of a result adds public.items(id)=<column 1> reading max_bid, name"; !strings.Contains(b.String(), want) {
		t.Errorf("text lacks %q:\n%s", want, b.String())
	}
}
