package quma

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true}, &env))
}

// The soundness property, checked against a real PostgreSQL: for random
// instantiations of a query Q and a write W, run Q, apply W, run Q again
// (then roll back). Whenever Q's result changed, the tags W publishes —
// computed from the rows W actually changed, old and new, as the
// invalidator does — must hit a tag Q's result holds, with a changed column
// that Q reads.

const propSchema = `
CREATE TABLE categories (id int PRIMARY KEY, name varchar(50));
CREATE TABLE regions (id int PRIMARY KEY, name varchar(25));
CREATE TABLE users (id int PRIMARY KEY, firstname varchar(20), lastname varchar(20), nickname varchar(20) NOT NULL UNIQUE, password varchar(20) NOT NULL, email varchar(50) NOT NULL, rating int, balance real, creation_date timestamp, region int NOT NULL);
CREATE TABLE items (id int PRIMARY KEY, name varchar(100), description text, initial_price real NOT NULL, quantity int NOT NULL, reserve_price real DEFAULT 0, buy_now real DEFAULT 0, nb_of_bids int DEFAULT 0, max_bid real DEFAULT 0, start_date timestamp, end_date timestamp, seller int NOT NULL, category int NOT NULL);
CREATE TABLE old_items (id int PRIMARY KEY, name varchar(100), description text, initial_price real NOT NULL, quantity int NOT NULL, reserve_price real DEFAULT 0, buy_now real DEFAULT 0, nb_of_bids int DEFAULT 0, max_bid real DEFAULT 0, start_date timestamp, end_date timestamp, seller int NOT NULL, category int NOT NULL);
CREATE TABLE bids (id int PRIMARY KEY, user_id int NOT NULL, item_id int NOT NULL, qty int NOT NULL, bid real NOT NULL, max_bid real NOT NULL, date timestamp);
CREATE TABLE comments (id int PRIMARY KEY, from_user_id int, to_user_id int, item_id int, rating int, date timestamp, comment text);
CREATE TABLE buy_now (id int PRIMARY KEY, buyer_id int, item_id int, qty int, date timestamp);
CREATE TABLE inv (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL, entry_date date NOT NULL);
`

var propBase = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func propSeed(r *rand.Rand) string {
	var b strings.Builder
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&b, "INSERT INTO categories VALUES (%d, 'cat%d');\n", i, i)
	}
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&b, "INSERT INTO regions VALUES (%d, 'region%d');\n", i, i)
	}
	for i := 1; i <= 14; i++ {
		fmt.Fprintf(&b, "INSERT INTO users VALUES (%d, 'f%d', 'l%d', 'user%d', 'pw%d', 'u%d@x', %d, %d, '%s', %d);\n",
			i, i, i, i, i%3, i, r.Intn(10), r.Intn(100), propBase.Format(time.RFC3339), 1+r.Intn(4))
	}
	for i := 1; i <= 18; i++ {
		end := propBase.Add(time.Duration(r.Intn(96)-48)*time.Hour + time.Duration(i)*time.Minute)
		fmt.Fprintf(&b, "INSERT INTO items VALUES (%d, 'item%d', 'd', %d, %d, 0, 0, %d, %d, '%s', '%s', %d, %d);\n",
			i, i, 1+r.Intn(50), 1+r.Intn(3), r.Intn(5), r.Intn(60), propBase.Add(-72*time.Hour).Format(time.RFC3339), end.Format(time.RFC3339), 1+r.Intn(14), 1+r.Intn(5))
	}
	for i := 1; i <= 6; i++ {
		fmt.Fprintf(&b, "INSERT INTO old_items VALUES (%d, 'old%d', 'd', 1, 1, 0, 0, 0, 0, '%s', '%s', %d, %d);\n",
			100+i, i, propBase.Add(-900*time.Hour).Format(time.RFC3339), propBase.Add(-time.Duration(r.Intn(1200))*time.Hour).Format(time.RFC3339), 1+r.Intn(14), 1+r.Intn(5))
	}
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b, "INSERT INTO bids VALUES (%d, %d, %d, 1, %d.5, %d.5, '%s');\n",
			i, 1+r.Intn(14), 1+r.Intn(18), i, i+3, propBase.Add(time.Duration(i)*time.Minute).Format(time.RFC3339))
	}
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&b, "INSERT INTO comments VALUES (%d, %d, %d, %d, %d, '%s', 'c%d');\n",
			i, 1+r.Intn(14), 1+r.Intn(14), 1+r.Intn(18), r.Intn(5)-2, propBase.Format(time.RFC3339), i)
	}
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&b, "INSERT INTO buy_now VALUES (%d, %d, %d, 1, '%s');\n", i, 1+r.Intn(14), 1+r.Intn(18), propBase.Add(-time.Duration(r.Intn(1000))*time.Hour).Format(time.RFC3339))
	}
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&b, "INSERT INTO inv VALUES (%d, 'thing%d', %d, '%s');\n", i, i%6, r.Intn(10), propBase.AddDate(0, 0, -r.Intn(30)).Format("2006-01-02"))
	}
	return b.String()
}

type propTemplate struct {
	sql string
	gen func(r *rand.Rand) []any
}

func uid(r *rand.Rand) int    { return 1 + r.Intn(15) }
func iid(r *rand.Rand) int    { return 1 + r.Intn(19) }
func cat(r *rand.Rand) int    { return 1 + r.Intn(5) }
func region(r *rand.Rand) int { return 1 + r.Intn(4) }
func now(r *rand.Rand) time.Time {
	return propBase.Add(time.Duration(r.Intn(48)-24) * time.Hour)
}
func nick(r *rand.Rand) string { return fmt.Sprintf("user%d", uid(r)) }

var propQueries = []propTemplate{
	{"SELECT id FROM users WHERE nickname = $1 AND password = $2", func(r *rand.Rand) []any { return []any{nick(r), fmt.Sprintf("pw%d", r.Intn(3))} }},
	{"SELECT * FROM regions WHERE name = $1", func(r *rand.Rand) []any { return []any{fmt.Sprintf("region%d", region(r))} }},
	{"SELECT * FROM users WHERE nickname = $1", func(r *rand.Rand) []any { return []any{nick(r)} }},
	{"SELECT * FROM categories", func(r *rand.Rand) []any { return nil }},
	{"SELECT * FROM regions", func(r *rand.Rand) []any { return nil }},
	{"SELECT id, name, initial_price, max_bid, nb_of_bids, end_date FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 5 OFFSET $3",
		func(r *rand.Rand) []any { return []any{cat(r), now(r), r.Intn(2) * 5} }},
	{"SELECT items.id, items.name, items.initial_price, items.max_bid, items.nb_of_bids, items.end_date FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND items.end_date >= $3 ORDER BY items.end_date LIMIT 5 OFFSET $4",
		func(r *rand.Rand) []any { return []any{cat(r), region(r), now(r), 0} }},
	{"SELECT * FROM items WHERE id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"SELECT * FROM old_items WHERE id = $1", func(r *rand.Rand) []any { return []any{100 + r.Intn(8)} }},
	{"SELECT MAX(bid) FROM bids WHERE item_id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"SELECT bid, qty FROM bids WHERE item_id = $1 ORDER BY bid DESC LIMIT $2", func(r *rand.Rand) []any { return []any{iid(r), 1 + r.Intn(3)} }},
	{"SELECT COUNT(*) FROM bids WHERE item_id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"SELECT nickname FROM users WHERE id = $1", func(r *rand.Rand) []any { return []any{uid(r)} }},
	{"SELECT * FROM users WHERE id = $1", func(r *rand.Rand) []any { return []any{uid(r)} }},
	{"SELECT * FROM comments WHERE to_user_id = $1", func(r *rand.Rand) []any { return []any{uid(r)} }},
	{"SELECT name FROM items WHERE id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"SELECT * FROM bids WHERE item_id = $1 ORDER BY date DESC", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"SELECT item_id, MAX(bids.max_bid) FROM bids, items WHERE bids.user_id = $1 AND bids.item_id = items.id AND items.end_date >= $2 GROUP BY item_id",
		func(r *rand.Rand) []any { return []any{uid(r), now(r)} }},
	{"SELECT item_id, MAX(bids.max_bid) FROM bids, old_items WHERE bids.user_id = $1 AND bids.item_id = old_items.id AND old_items.end_date >= $2::timestamp - interval '30 days' GROUP BY item_id",
		func(r *rand.Rand) []any { return []any{uid(r), now(r)} }},
	{"SELECT * FROM buy_now WHERE buyer_id = $1 AND date >= $2::timestamp - interval '30 days'", func(r *rand.Rand) []any { return []any{uid(r), now(r)} }},
	{"SELECT * FROM items WHERE seller = $1 AND end_date >= $2", func(r *rand.Rand) []any { return []any{uid(r), now(r)} }},
	{"SELECT * FROM old_items WHERE seller = $1 AND end_date >= $2::timestamp - interval '30 days'", func(r *rand.Rand) []any { return []any{uid(r), now(r)} }},
	// inventory (Ferdinand)
	{"SELECT qty FROM inv WHERE name = $1", func(r *rand.Rand) []any { return []any{fmt.Sprintf("thing%d", r.Intn(7))} }},
	{"SELECT name FROM inv WHERE entry_date > $1", func(r *rand.Rand) []any { return []any{propBase.AddDate(0, 0, -r.Intn(30))} }},
	{"SELECT * FROM inv WHERE qty < $1", func(r *rand.Rand) []any { return []any{r.Intn(10)} }},
	// more shapes
	{"SELECT i.name FROM items i JOIN users u ON i.seller = u.id WHERE u.nickname = $1", func(r *rand.Rand) []any { return []any{nick(r)} }},
	{"SELECT u.nickname, c.rating FROM users u LEFT JOIN comments c ON c.to_user_id = u.id WHERE u.id = $1", func(r *rand.Rand) []any { return []any{uid(r)} }},
	{"SELECT name FROM items WHERE id IN ($1, $2)", func(r *rand.Rand) []any { return []any{iid(r), iid(r)} }},
	{"SELECT name FROM items WHERE id = ANY($1)", func(r *rand.Rand) []any { return []any{[]int32{int32(iid(r)), int32(iid(r))}} }},
	{"SELECT name FROM items WHERE seller IN (SELECT id FROM users WHERE region = $1)", func(r *rand.Rand) []any { return []any{region(r)} }},
	{"SELECT count(*) FROM bids WHERE item_id IN (SELECT id FROM items WHERE category = $1)", func(r *rand.Rand) []any { return []any{cat(r)} }},
	{"SELECT name FROM items WHERE category = $1 OR seller = $2", func(r *rand.Rand) []any { return []any{cat(r), uid(r)} }},
	{"SELECT id FROM users WHERE id = $1 UNION SELECT seller FROM items WHERE category = $2", func(r *rand.Rand) []any { return []any{uid(r), cat(r)} }},
	{"SELECT u.nickname FROM users u WHERE EXISTS (SELECT 1 FROM comments c WHERE c.to_user_id = u.id AND c.rating = $1)", func(r *rand.Rand) []any { return []any{r.Intn(5) - 2} }},
	{"SELECT count(*) FROM items", func(r *rand.Rand) []any { return nil }},
	// derived tag columns (items keyed on their seller's region or nickname)
	{"SELECT count(*) FROM items, users WHERE items.seller = users.id AND users.region = $1", func(r *rand.Rand) []any { return []any{region(r)} }},
	{"SELECT items.id, items.name, users.nickname FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2",
		func(r *rand.Rand) []any { return []any{cat(r), region(r)} }},
	{"SELECT i.name, u.nickname FROM items i LEFT JOIN users u ON i.seller = u.id AND u.region = $2 WHERE i.category = $1",
		func(r *rand.Rand) []any { return []any{cat(r), region(r)} }},
}

var propWrites = []propTemplate{
	{"INSERT INTO users (id, nickname, password, email, rating, region) VALUES ($1, $2, 'pw', 'e', 0, $3)", func(r *rand.Rand) []any {
		return []any{100 + r.Intn(1000), fmt.Sprintf("new%d", r.Intn(1000)), region(r)}
	}},
	{"UPDATE users SET region = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{region(r), uid(r)} }},
	{"UPDATE users SET rating = rating + $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{1 + r.Intn(3), uid(r)} }},
	{"UPDATE users SET nickname = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{nick(r), uid(r)} }},
	{"UPDATE users SET password = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{fmt.Sprintf("pw%d", r.Intn(3)), uid(r)} }},
	{"DELETE FROM users WHERE id = $1", func(r *rand.Rand) []any { return []any{uid(r)} }},
	{"UPDATE users SET id = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{100 + r.Intn(1000), uid(r)} }},
	{"INSERT INTO items (id, name, initial_price, quantity, end_date, seller, category) VALUES ($1, 'n', 1, 1, $2, $3, $4)", func(r *rand.Rand) []any { return []any{100 + r.Intn(1000), now(r), uid(r), cat(r)} }},
	{"UPDATE items SET quantity = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{r.Intn(4), iid(r)} }},
	{"UPDATE items SET max_bid = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{r.Intn(100), iid(r)} }},
	{"UPDATE items SET nb_of_bids = nb_of_bids + 1 WHERE id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"UPDATE items SET category = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{cat(r), iid(r)} }},
	{"UPDATE items SET seller = $1 WHERE category = $2", func(r *rand.Rand) []any { return []any{uid(r), cat(r)} }},
	{"UPDATE items SET end_date = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{now(r), iid(r)} }},
	{"UPDATE items SET name = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{fmt.Sprintf("renamed%d", r.Intn(3)), iid(r)} }},
	{"UPDATE items SET id = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{iid(r) + 200, iid(r)} }},
	{"DELETE FROM items WHERE id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"INSERT INTO old_items (id, name, initial_price, quantity, end_date, seller, category) VALUES ($1, 'o', 1, 1, $2, $3, 1)", func(r *rand.Rand) []any { return []any{100 + r.Intn(10), now(r), uid(r)} }},
	{"INSERT INTO bids (id, user_id, item_id, qty, bid, max_bid, date) VALUES ($1, $2, $3, 1, $4, $4, $5)", func(r *rand.Rand) []any { return []any{100 + r.Intn(1000), uid(r), iid(r), 100 + r.Intn(100), now(r)} }},
	{"UPDATE bids SET item_id = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{iid(r), 1 + r.Intn(40)} }},
	{"UPDATE bids SET bid = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{r.Intn(100), 1 + r.Intn(40)} }},
	{"DELETE FROM bids WHERE item_id = $1", func(r *rand.Rand) []any { return []any{iid(r)} }},
	{"INSERT INTO comments (id, from_user_id, to_user_id, item_id, rating, date, comment) VALUES ($1, $2, $3, $4, $5, $6, 'x')", func(r *rand.Rand) []any {
		return []any{100 + r.Intn(1000), uid(r), uid(r), iid(r), r.Intn(5) - 2, now(r)}
	}},
	{"UPDATE comments SET to_user_id = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{uid(r), 1 + r.Intn(20)} }},
	{"UPDATE comments SET rating = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{r.Intn(5) - 2, 1 + r.Intn(20)} }},
	{"INSERT INTO buy_now (id, buyer_id, item_id, qty, date) VALUES ($1, $2, $3, 1, $4)", func(r *rand.Rand) []any { return []any{100 + r.Intn(1000), uid(r), iid(r), now(r)} }},
	{"UPDATE regions SET name = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{fmt.Sprintf("region%d", region(r)), region(r)} }},
	{"INSERT INTO categories (id, name) VALUES ($1, 'c')", func(r *rand.Rand) []any { return []any{10 + r.Intn(100)} }},
	{"INSERT INTO inv (id, name, qty, entry_date) VALUES ($1, $2, $3, $4)", func(r *rand.Rand) []any {
		return []any{100 + r.Intn(1000), fmt.Sprintf("thing%d", r.Intn(7)), r.Intn(10), propBase}
	}},
	{"UPDATE inv SET qty = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{r.Intn(10), 1 + r.Intn(10)} }},
	{"UPDATE inv SET name = $1 WHERE id = $2", func(r *rand.Rand) []any { return []any{fmt.Sprintf("thing%d", r.Intn(7)), 1 + r.Intn(10)} }},
	{"DELETE FROM inv WHERE qty < $1", func(r *rand.Rand) []any { return []any{r.Intn(5)} }},
}

// propRow is one row as text (nil for NULL), by column.
type propRow map[string]*string

// snapshotTable reads every row of a table as PostgreSQL's text output, by primary key.
func snapshotTable(ctx context.Context, tx pgx.Tx, t *Table) (map[string]propRow, error) {
	cols := t.ColumnNames()
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = pgx.Identifier{c}.Sanitize() + "::text"
	}
	rows, err := tx.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+pgx.Identifier(strings.Split(t.Name, ".")).Sanitize())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]propRow{}
	for rows.Next() {
		vals := make([]*string, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := propRow{}
		var pk []string
		for i, c := range cols {
			row[c] = vals[i]
		}
		for _, c := range t.PrimaryKey {
			pk = append(pk, *row[c])
		}
		out[strings.Join(pk, ",")] = row
	}
	return out, rows.Err()
}

// published is what the invalidator publishes for one changed row: the
// keyed tags of its old and new versions and the columns that changed.
type published struct {
	table   string
	keyed   map[string]bool
	changed map[string]bool
	rowSet  bool // a row appeared or disappeared (INSERT, DELETE, a key change)
}

// propSnaps are snapshots of tables, by name.
type propSnaps map[string]map[string]propRow

// columnText is a row's value of a tag column: for a derived column, the
// column it names of the row of the referenced table (in snaps) whose
// primary key the row's foreign key holds; nil for NULL or no such row.
func columnText(row propRow, c string, snaps propSnaps) *string {
	fk, ref, col, ok := tags.ParseDerivedColumn(c)
	if !ok {
		return row[c]
	}
	if row[fk] == nil || snaps[ref][*row[fk]] == nil {
		return nil
	}
	return snaps[ref][*row[fk]][col]
}

// keyedTag is a row's tag on a tag column set, or "" when a value is NULL.
func keyedTag(table string, set []string, row propRow, snaps propSnaps) string {
	vals := make([]string, 0, len(set))
	for _, c := range set {
		v := columnText(row, c, snaps)
		if v == nil {
			return ""
		}
		vals = append(vals, *v)
	}
	return tags.Tag{Table: table, Columns: set, Values: vals}.String()
}

// publishedTags is what the invalidator publishes for the changed rows of
// t (before and after are its snapshots): each row's keyed tags, old and
// new, the old values of derived columns from the snapshots of the
// referenced tables before the write (was), the new ones from those after
// (is).
func publishedTags(t *Table, sets [][]string, before, after map[string]propRow, was, is propSnaps) []published {
	var out []published
	add := func(old, new propRow) {
		p := published{table: t.Name, keyed: map[string]bool{}, changed: map[string]bool{}, rowSet: old == nil || new == nil}
		for _, c := range t.ColumnNames() {
			if old == nil || new == nil || !sameText(old[c], new[c]) {
				p.changed[c] = true
			}
		}
		if len(p.changed) == 0 {
			return // an UPDATE that changed nothing still publishes in the real stream; it cannot change a result
		}
		for i, row := range []propRow{old, new} {
			if row == nil {
				continue
			}
			snaps := [2]propSnaps{was, is}[i]
			for _, set := range sets {
				if tg := keyedTag(t.Name, set, row, snaps); tg != "" {
					p.keyed[tg] = true
				}
			}
		}
		out = append(out, p)
	}
	for k, old := range before {
		add(old, after[k])
	}
	for k, new := range after {
		if before[k] == nil {
			add(nil, new)
		}
	}
	return out
}

// dropDerivedNewForTest makes the simulated invalidator miss the new tag
// of a row whose derived values a write to the referenced table changed,
// so that a test can prove the property test notices.
var dropDerivedNewForTest = false

// derivedPublished is what the invalidator publishes, as changes of rows,
// for the rows of t whose values of a derived tag column set through a
// written table changed without a change of their own: the old and new
// keyed tags. before and after are t's snapshots; was and is those of the
// referenced tables.
func derivedPublished(t *Table, sets [][]string, written map[string]bool, before, after map[string]propRow, was, is propSnaps) []published {
	var out []published
	for _, set := range sets {
		through := false
		for _, c := range set {
			_, ref, _, ok := tags.ParseDerivedColumn(c)
			through = through || ok && written[ref]
		}
		if !through {
			continue
		}
		for k, oldRow := range before {
			newRow := after[k]
			if newRow == nil {
				continue // deleted: its own change
			}
			old, new := keyedTag(t.Name, set, oldRow, was), keyedTag(t.Name, set, newRow, is)
			if old == new {
				continue
			}
			p := published{table: t.Name, keyed: map[string]bool{}, changed: map[string]bool{}, rowSet: true}
			if old != "" {
				p.keyed[old] = true
			}
			if new != "" && !dropDerivedNewForTest {
				p.keyed[new] = true
			}
			out = append(out, p)
		}
	}
	return out
}

// snapshotTables are the tables a write's publications are computed from:
// those it writes, and for a derived tag column set of one of them or
// through one of them, the set's table and the tables it goes through.
func snapshotTables(w *Template, sets map[string][][]string) (written, snap map[string]bool) {
	written, snap = map[string]bool{}, map[string]bool{}
	for _, wr := range w.Writes {
		written[wr.Table], snap[wr.Table] = true, true
	}
	for table, ss := range sets {
		for _, set := range ss {
			refs := map[string]bool{}
			for _, c := range set {
				if _, ref, _, ok := tags.ParseDerivedColumn(c); ok {
					refs[ref] = true
				}
			}
			hit := written[table]
			for ref := range refs {
				hit = hit || written[ref]
			}
			if !hit || len(refs) == 0 {
				continue
			}
			snap[table] = true
			for ref := range refs {
				snap[ref] = true
			}
		}
	}
	return written, snap
}

func sameText(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// hits reports whether a change reaches a tag the result holds, by the
// cache-node's matching rule.
func hits(qt QueryTag, p published) bool {
	if qt.Table != p.table {
		return false
	}
	if !qt.IsTable() && !p.keyed[qt.String()] {
		return false
	}
	// A row that appears or disappears changes any result over its table
	// (count(*) reads no column); an UPDATE only one that reads a changed column.
	if qt.AllColumns || p.rowSet {
		return true
	}
	for _, c := range qt.Reads {
		if p.changed[c] {
			return true
		}
	}
	return false
}

func resultOf(ctx context.Context, tx pgx.Tx, sql string, params []any) (string, error) {
	rows, err := tx.Query(ctx, sql, params...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "", err
		}
		lines = append(lines, fmt.Sprint(vals...))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n"), rows.Err()
}

type propStats struct {
	runs, changed, violations int
	firstViolation            string
}

// checkSoundness runs n random (Q, W) pairs.
func checkSoundness(t *testing.T, ctx context.Context, conn *pgx.Conn, schema *Schema, queries, writes []propTemplate, n int, seed int64) propStats {
	t.Helper()
	var work []Statement
	for _, q := range append(append([]propTemplate{}, queries...), writes...) {
		work = append(work, Statement{SQL: q.sql})
	}
	sol, err := AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	an := sol.Analyzer()
	sets := sol.TagSets()
	r := rand.New(rand.NewSource(seed))
	// Most pairs share a table, so that writes really change results; the
	// rest are drawn blindly.
	related := map[string][]propTemplate{}
	for _, w := range writes {
		wt, err := an.Prepare(w.sql)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range queries {
			qt, err := an.Prepare(q.sql)
			if err != nil {
				t.Fatal(err)
			}
			if sharesTable(wt, qt) {
				related[w.sql] = append(related[w.sql], q)
			}
		}
	}
	var st propStats
	for i := 0; i < n; i++ {
		w := writes[r.Intn(len(writes))]
		q := queries[r.Intn(len(queries))]
		if rel := related[w.sql]; len(rel) > 0 && r.Intn(10) < 9 {
			q = rel[r.Intn(len(rel))]
		}
		qp, wp := q.gen(r), w.gen(r)
		qt, err := an.Prepare(q.sql)
		if err != nil || !qt.Cacheable {
			t.Fatalf("%s: %v %s", q.sql, err, qt.Reason)
		}
		wt, err := an.Prepare(w.sql)
		if err != nil {
			t.Fatal(err)
		}
		qtags, err := qt.Tags(qp)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer tx.Rollback(ctx)
			before, err := resultOf(ctx, tx, q.sql, qp)
			if err != nil {
				t.Fatalf("%s %v: %v", q.sql, qp, err)
			}
			written, snapped := snapshotTables(wt, sets)
			snaps := propSnaps{}
			for table := range snapped {
				if snaps[table], err = snapshotTable(ctx, tx, schema.Tables[table]); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT w"); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, w.sql, wp...); err != nil {
				return // a unique violation and the like: nothing written
			}
			st.runs++
			after, err := resultOf(ctx, tx, q.sql, qp)
			if err != nil {
				t.Fatal(err)
			}
			if after == before {
				return
			}
			st.changed++
			nows := propSnaps{}
			for table := range snapped {
				if nows[table], err = snapshotTable(ctx, tx, schema.Tables[table]); err != nil {
					t.Fatal(err)
				}
			}
			var pubs []published
			for table := range written {
				pubs = append(pubs, publishedTags(schema.Tables[table], sets[table], snaps[table], nows[table], snaps, nows)...)
			}
			for table := range snapped {
				pubs = append(pubs, derivedPublished(schema.Tables[table], sets[table], written, snaps[table], nows[table], snaps, nows)...)
			}
			for _, p := range pubs {
				for _, tg := range qtags {
					if hits(tg, p) {
						if !MayAffect(wt, qt) {
							t.Errorf("dependency matrix says %q is independent of %q, but it changed the result", w.sql, q.sql)
						}
						return
					}
				}
			}
			st.violations++
			if st.firstViolation == "" {
				var names []string
				for _, tg := range qtags {
					names = append(names, tg.String())
				}
				st.firstViolation = fmt.Sprintf("Q %s %v (tags %v)\nW %s %v\nresult before:\n%s\nafter:\n%s", q.sql, qp, names, w.sql, wp, before, after)
			}
		}()
	}
	return st
}

func sharesTable(w, q *Template) bool {
	for _, wr := range w.Writes {
		for _, d := range q.Deps {
			if d.Table == wr.Table {
				return true
			}
		}
	}
	return false
}

func propDatabase(t *testing.T) (*pgx.Conn, *Schema) {
	t.Helper()
	ctx := context.Background()
	url := testenv.Database(t, env.PG)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, propSchema); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, propSeed(rand.New(rand.NewSource(1)))); err != nil {
		t.Fatal(err)
	}
	return conn, mustDDL(t, propSchema)
}

func TestSoundnessAgainstPostgres(t *testing.T) {
	conn, schema := propDatabase(t)
	n := 3000
	if testing.Short() {
		n = 500
	}
	st := checkSoundness(t, context.Background(), conn, schema, propQueries, propWrites, n, 42)
	t.Logf("%d write/query pairs applied, %d changed the result, %d violations", st.runs, st.changed, st.violations)
	if st.violations > 0 {
		t.Fatalf("%d of %d result changes were not invalidated; first:\n%s", st.violations, st.changed, st.firstViolation)
	}
	// A vacuous run proves nothing: the writes must really change results.
	if st.changed < n/20 {
		t.Fatalf("only %d of %d pairs changed a result: the test exercises too little", st.changed, st.runs)
	}
}

// derivedQueries and derivedWrites exercise derived tag columns: queries
// keyed on items' seller's region or nickname, writes to both tables.
var derivedQueries, derivedWrites = func() ([]propTemplate, []propTemplate) {
	var qs, ws []propTemplate
	for _, q := range propQueries {
		if strings.Contains(q.sql, "users") && strings.Contains(q.sql, "items") && !strings.Contains(q.sql, "LEFT") && !strings.Contains(q.sql, "UNION") {
			qs = append(qs, q)
		}
	}
	for _, w := range propWrites {
		if strings.Contains(w.sql, " users ") || strings.Contains(w.sql, " items ") {
			ws = append(ws, w)
		}
	}
	return qs, ws
}()

// TestSoundnessDerivedColumns checks the queries keyed on derived tag
// columns harder, and that they are: the region search holds one tag
// keyed on the category and the seller's region, and none of users.
func TestSoundnessDerivedColumns(t *testing.T) {
	conn, schema := propDatabase(t)
	var work []Statement
	for _, q := range append(append([]propTemplate{}, derivedQueries...), derivedWrites...) {
		work = append(work, Statement{SQL: q.sql})
	}
	sol, err := AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	search, err := sol.Analyzer().Prepare(propQueries[6].sql)
	if err != nil {
		t.Fatal(err)
	}
	qtags, err := search.Tags([]any{3, 2, propBase, 0})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range qtags {
		names = append(names, q.String())
	}
	if got, want := strings.Join(names, " "), `public.items(category,"seller->public.users.region")=(3,2) public.items(category,"seller->public.users.region")=`; got != want {
		t.Fatalf("region search tags %s, want %s", got, want)
	}
	n := 3000
	if testing.Short() {
		n = 500
	}
	st := checkSoundness(t, context.Background(), conn, schema, derivedQueries, derivedWrites, n, 11)
	t.Logf("%d write/query pairs applied, %d changed the result, %d violations", st.runs, st.changed, st.violations)
	if st.violations > 0 {
		t.Fatalf("%d of %d result changes were not invalidated; first:\n%s", st.violations, st.changed, st.firstViolation)
	}
	if st.changed < n/20 {
		t.Fatalf("only %d of %d pairs changed a result: the test exercises too little", st.changed, st.runs)
	}
}

// TestSoundnessCatchesMissedDerivedTags has the simulated invalidator miss
// the new tag of a row whose seller's region changed, and requires the
// property test to notice: it does check the derived tags.
func TestSoundnessCatchesMissedDerivedTags(t *testing.T) {
	conn, schema := propDatabase(t)
	dropDerivedNewForTest = true
	defer func() { dropDerivedNewForTest = false }()
	var userWrites []propTemplate
	for _, w := range derivedWrites {
		if strings.Contains(w.sql, " users ") {
			userWrites = append(userWrites, w)
		}
	}
	st := checkSoundness(t, context.Background(), conn, schema, derivedQueries, userWrites, 3000, 11)
	if st.violations == 0 {
		t.Fatalf("missed derived tags passed the soundness test (%d pairs, %d changes)", st.runs, st.changed)
	}
	t.Logf("missed derived tags caught: %d violations in %d changes", st.violations, st.changed)
}

// TestSoundnessCatchesBrokenAnalyzer breaks the analyzer on purpose (ranges
// taken for equalities) and requires the property test to notice.
func TestSoundnessCatchesBrokenAnalyzer(t *testing.T) {
	conn, schema := propDatabase(t)
	breakRangesForTest = true
	defer func() { breakRangesForTest = false }()
	st := checkSoundness(t, context.Background(), conn, schema, propQueries, propWrites, 1500, 7)
	if st.violations == 0 {
		t.Fatalf("a broken analyzer passed the soundness test (%d pairs, %d changes)", st.runs, st.changed)
	}
	t.Logf("broken analyzer caught: %d violations in %d changes", st.violations, st.changed)
}
