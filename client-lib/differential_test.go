package larder

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver: the reference
)

// dsn is the stack's larder DSN, with extra parameters (PostgreSQL's or
// larder.*) added as written.
func (s *stack) dsn(extra ...string) string {
	q := url.Values{}
	q.Set("larder.nats", s.nats)
	q.Set("larder.nodes", s.node)
	q.Set("larder.quma", s.quma)
	q.Set("larder.prefix", s.prefix)
	q.Set("larder.staleness", "5s")
	sep := "?"
	if strings.Contains(s.url, "?") {
		sep = "&"
	}
	out := s.url + sep + q.Encode()
	for _, e := range extra {
		out += "&" + e
	}
	return out
}

func openDB(t *testing.T, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

const typesDDL = `CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE typed (id int PRIMARY KEY, u uuid, j json, jb jsonb, ia int4[], ta text[], n numeric, n2 numeric(10,2),
  ts timestamp, tz timestamptz, d date, iv interval, b bytea, ip inet, cidr_ cidr, m mood, p posint, f4 real, f8 float8,
  i2 int2, i8 int8, bo bool, t text, vc varchar(5), c3 char(3), tm time, o oid, x xml, mac macaddr, pt point, r int4range);
ALTER TABLE typed REPLICA IDENTITY FULL`

const typesSeed = `INSERT INTO typed VALUES
 (1, '12345678-9abc-def0-1234-56789abcdef0', '{"a": 1, "b": [1,2]}', '{"b": 2, "a": {"c": null}}', '{1,2,3}', '{"x","y z",NULL}', 0.00, 12.5,
  '2024-02-29 12:34:56.789', '2024-02-29 12:34:56.789+02', '2024-02-29', '1 year 2 mons 3 days 04:05:06.7', '\x00ff10', '10.0.0.1/8', '10.0.0.0/8', 'happy', 7, 1.5, 2.25,
  -3, 9000000000, true, 'hello', 'abc', 'ab', '13:14:15', 42, '<a>b</a>', '08:00:2b:01:02:03', '(1,2)', '[1,5)'),
 (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (3, '00000000-0000-0000-0000-000000000000', '[]', '"s"', '{}', '{}', -1e-20, -0.01, '0001-01-01 00:00:00', 'infinity', '-infinity', '-1 days', '', '::1', '::/0', 'sad', 1, 'NaN', '-Infinity',
  32767, -9223372036854775808, false, '', '', '', '00:00:00', 0, '', 'ff:ff:ff:ff:ff:ff', '(0,0)', 'empty')`

// typedQueries exercise every column, arguments of many Go forms, and
// literals.
type argCase struct {
	sql  string
	args []any
}

type userID int64

type valuer struct{ id int }

func (v valuer) Value() (driver.Value, error) { return int64(v.id), nil }

func typedCases() []argCase {
	one, two := 1, 3
	pone := &one
	ts := time.Date(2024, 2, 29, 12, 34, 56, 789000000, time.UTC)
	return []argCase{
		{"SELECT * FROM typed ORDER BY id", nil},
		{"SELECT * FROM typed WHERE id = $1", []any{1}},
		{"SELECT * FROM typed WHERE id = $1", []any{pone}},
		{"SELECT * FROM typed WHERE id = $1", []any{&two}},
		{"SELECT * FROM typed WHERE id = $1", []any{userID(3)}},
		{"SELECT * FROM typed WHERE id = $1", []any{valuer{1}}},
		{"SELECT * FROM typed WHERE id = $1", []any{int8(3)}},
		{"SELECT id FROM typed WHERE u = $1", []any{"12345678-9abc-def0-1234-56789abcdef0"}},
		{"SELECT id FROM typed WHERE b = $1", []any{[]byte{0, 255, 16}}},
		{"SELECT id FROM typed WHERE t = $1", []any{"hello"}},
		{"SELECT id FROM typed WHERE t IS NOT DISTINCT FROM $1 ORDER BY id", []any{nil}},
		{"SELECT id FROM typed WHERE ts = $1", []any{ts}},
		{"SELECT id FROM typed WHERE ts = $1", []any{ts.In(time.FixedZone("x", 3600))}},
		{"SELECT id, n, n2 FROM typed WHERE id = 1", nil},
		{"SELECT id, n, n2 FROM typed WHERE id = 3", nil},
		{"SELECT id, jb FROM typed WHERE id = 1", nil},
		{"SELECT id, ia, ta FROM typed WHERE id = 1", nil},
	}
}

// rowsOf reads every row of a database/sql query as driver values.
func rowsOf(t *testing.T, q queryer, c argCase) ([]string, [][]any) {
	t.Helper()
	desc, out, err := tryRowsOf(q, c)
	if err != nil {
		t.Fatalf("%s %v: %v", c.sql, c.args, err)
	}
	return desc, out
}

type queryer interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

// tryRowsOf reads every row of a database/sql query as driver values,
// with the columns' descriptions.
func tryRowsOf(q queryer, c argCase) ([]string, [][]any, error) {
	rows, err := q.QueryContext(context.Background(), c.sql, c.args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, nil, err
	}
	types, err := rows.ColumnTypes()
	if err != nil {
		return nil, nil, err
	}
	var desc []string
	for _, ct := range types {
		desc = append(desc, fmt.Sprintf("%s:%s:%v", ct.Name(), ct.DatabaseTypeName(), ct.ScanType()))
	}
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, nil, err
		}
		out = append(out, vals)
	}
	return desc, out, rows.Err()
}

// Every query through Larder's database/sql driver returns exactly what
// pgx's stdlib driver returns for the same statement — on the miss, from
// the cache-node, and from the L1 — across PostgreSQL's types and Go's
// argument forms.
func TestDifferentialDatabaseSQL(t *testing.T) {
	cases := typedCases()
	var templates []string
	for _, c := range cases {
		templates = append(templates, c.sql)
	}
	s := startStackWith(t, typesDDL, typesSeed, templates...)
	s.client(t, 0) // waits for pins
	direct := openDB(t, "pgx", s.url)
	for _, l1 := range []string{"0", "8388608"} {
		t.Run("l1="+l1, func(t *testing.T) {
			db := openDB(t, DriverName, s.dsn("larder.l1="+l1, "application_name=diff"+l1))
			for round := 0; round < 3; round++ { // miss, then hits
				for _, c := range cases {
					wantDesc, want := rowsOf(t, direct, c)
					tx, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
					if err != nil {
						t.Fatal(err)
					}
					gotDesc, got := rowsOf(t, tx, c)
					_ = tx.Commit()
					if !reflect.DeepEqual(gotDesc, wantDesc) {
						t.Errorf("round %d, %s %v: columns %v, want %v", round, c.sql, c.args, gotDesc, wantDesc)
					}
					if g, w := show(got), show(want); g != w {
						t.Errorf("round %d, %s %v:\n got  %.600s\n want %.600s", round, c.sql, c.args, g, w)
					}
				}
				time.Sleep(300 * time.Millisecond) // let the puts land
			}
			st, _ := DriverStats(s.dsn("larder.l1="+l1, "application_name=diff"+l1))
			if st.L1Hits.Load()+st.NodeHits.Load() == 0 {
				t.Fatal("nothing was served from the cache: the hit path went unchecked")
			}
			t.Logf("l1 hits %d, node hits %d, misses %d, uncacheable %d", st.L1Hits.Load(), st.NodeHits.Load(), st.Misses.Load(), st.Uncacheable.Load())
		})
	}
}

// The native API returns what pgx returns: Values() and Scan into typed
// destinations, miss and hit.
func TestDifferentialNative(t *testing.T) {
	cases := typedCases()
	var templates []string
	for _, c := range cases {
		templates = append(templates, c.sql)
	}
	s := startStackWith(t, typesDDL, typesSeed, templates...)
	c := s.client(t, 4<<20)
	ctx := context.Background()
	ref, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close(ctx)
	for round := 0; round < 3; round++ {
		for _, q := range cases {
			prows, err := ref.Query(ctx, q.sql, q.args...)
			if err != nil {
				t.Fatal(err)
			}
			var want [][]any
			for prows.Next() {
				v, err := prows.Values()
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, v)
			}
			prows.Close()
			tx, err := c.BeginRO(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.Query(ctx, q.sql, q.args...)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]any
			for rows.Next() {
				v, err := rows.Values()
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, v)
			}
			_ = tx.Commit(ctx)
			if g, w := show(got), show(want); g != w {
				t.Errorf("round %d, %s %v:\n got  %.600s\n want %.600s", round, q.sql, q.args, g, w)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	if c.Stats().L1Hits.Load()+c.Stats().NodeHits.Load() == 0 {
		t.Fatal("nothing was served from the cache")
	}
}

// Texts that differ only in a literal are different statements: each has
// its own entry (a key of the normalized text would serve item 1's row
// for item 2).
func TestLiteralsAreInTheKey(t *testing.T) {
	s := startStack(t)
	if _, err := s.conn.Exec(context.Background(), "UPDATE accounts SET balance = 100 + id"); err != nil {
		t.Fatal(err)
	}
	c := s.client(t, 4<<20)
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		for id := 1; id <= accounts; id++ {
			for _, q := range []string{
				fmt.Sprintf("SELECT balance FROM accounts WHERE id = %d", id),
				fmt.Sprintf("SELECT balance FROM accounts WHERE id = %d LIMIT %d", id, id),
			} {
				tx, err := c.BeginRO(ctx, 0)
				if err != nil {
					t.Fatal(err)
				}
				var b int
				if err := tx.QueryRow(ctx, q, nil, &b); err != nil {
					t.Fatal(err)
				}
				_ = tx.Commit(ctx)
				if b != 100+id {
					t.Fatalf("round %d: %s gave %d, want %d", round, q, b, 100+id)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if c.Stats().L1Hits.Load()+c.Stats().NodeHits.Load() == 0 {
		t.Fatal("nothing was served from the cache")
	}
}

// show prints values with their types (NaN equals NaN here, unlike in
// reflect.DeepEqual).
func show(v any) string { return fmt.Sprintf("%#v", v) }
