package quma

import (
	"context"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/larderdb/larder/internal/testenv"
)

// catalogExtrasDDL adds to the RUBiS schema one of each thing the loaders
// read besides plain tables.
const catalogExtrasDDL = `
CREATE VIEW active_items AS SELECT id, name, seller FROM items WHERE end_date > now();
CREATE UNIQUE INDEX users_email ON users (email);
ALTER TABLE bids REPLICA IDENTITY FULL;
CREATE FUNCTION item_price(item int) RETURNS real LANGUAGE sql STABLE AS 'SELECT initial_price FROM items WHERE id = item';
`

// catalogFeaturesDDL exercises what LoadDDL models beyond RUBiS, so that
// the real server settles what each statement does.
const catalogFeaturesDDL = `
SET client_min_messages = warning;
CREATE SCHEMA shop;
CREATE DOMAIN money_t AS numeric(10,2);
CREATE DOMAIN positive AS money_t CHECK (VALUE > 0);
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE SEQUENCE counter;
CREATE TABLE shop.orders (
	id bigserial PRIMARY KEY,
	"Customer" text NOT NULL,
	total positive,
	tags money_t[],
	m mood,
	code char(4),
	flags bit varying(8),
	at timestamp with time zone DEFAULT now(),
	f float,
	dp double precision,
	small smallserial,
	CONSTRAINT orders_code UNIQUE (code) DEFERRABLE
);
COMMENT ON TABLE shop.orders IS 'orders';
CREATE UNIQUE INDEX orders_cust ON shop.orders ("Customer", at) INCLUDE (total);
CREATE UNIQUE INDEX orders_partial ON shop.orders (total) WHERE total > 100;
CREATE UNIQUE INDEX orders_expr ON shop.orders (lower("Customer"));
CREATE INDEX orders_at ON shop.orders (at);
CREATE TABLE t (a int NOT NULL, b int NOT NULL, c text, d int GENERATED ALWAYS AS IDENTITY, e int);
ALTER TABLE t ADD UNIQUE (c), ADD CONSTRAINT t_pk PRIMARY KEY (a), ADD UNIQUE (b, a), ADD UNIQUE (a);
CREATE UNIQUE INDEX t_b ON t (b);
ALTER TABLE t REPLICA IDENTITY USING INDEX t_b;
ALTER TABLE t ALTER COLUMN e SET NOT NULL, ALTER COLUMN e TYPE bigint;
CREATE TABLE n (id int PRIMARY KEY, v text);
ALTER TABLE n REPLICA IDENTITY NOTHING;
CREATE TABLE k (id int, code text UNIQUE NOT NULL, UNIQUE (id));
ALTER TABLE k REPLICA IDENTITY USING INDEX k_code_key;
CREATE TABLE u (x int NOT NULL, y int, UNIQUE (x, y), UNIQUE (y, x));
CREATE UNIQUE INDEX ON u (x);
CREATE UNIQUE INDEX ON u (x);
ALTER TABLE u REPLICA IDENTITY USING INDEX u_x_idx1;
CREATE TABLE m (id int, region text NOT NULL, amount numeric, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE UNIQUE INDEX m_amount ON m (amount, region);
CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu');
CREATE TABLE m_us PARTITION OF m (amount WITH OPTIONS NOT NULL) FOR VALUES IN ('us');
CREATE TABLE base (id int NOT NULL, note text);
CREATE TABLE child (extra int) INHERITS (base);
ALTER TABLE base ADD COLUMN added int;
CREATE TABLE lk (LIKE t INCLUDING INDEXES, more int);
CREATE TABLE r (a int PRIMARY KEY, b int, c int UNIQUE, d int);
ALTER TABLE r RENAME COLUMN b TO bb;
ALTER TABLE r DROP COLUMN c;
ALTER TABLE r RENAME TO r2;
ALTER TABLE r2 ADD CONSTRAINT r2_d UNIQUE (d);
ALTER TABLE r2 DROP CONSTRAINT r2_d;
CREATE TABLE gone (id int);
DROP TABLE gone;
CREATE TEMP TABLE scratch (id int PRIMARY KEY, v text);
CREATE VIEW v (x, y) AS SELECT a, c FROM t;
CREATE MATERIALIZED VIEW shop.mv AS SELECT count(*) AS n FROM shop.orders;
CREATE FUNCTION shop.f(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
CREATE FUNCTION g() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1';
CREATE FUNCTION g(int) RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE FUNCTION h(int) RETURNS int LANGUAGE sql AS 'SELECT 1';
ALTER FUNCTION h(int) IMMUTABLE;
CREATE PROCEDURE p() LANGUAGE sql AS 'SELECT 1';
`

func catalogRUBiS(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/rubis/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLoadCatalogMatchesDDL runs DDL on a real PostgreSQL and checks that
// the catalog says what LoadDDL says of the same text.
func TestLoadCatalogMatchesDDL(t *testing.T) {
	srv := testenv.Postgres(t)
	for _, tc := range []struct{ name, ddl string }{
		{"rubis", catalogRUBiS(t) + catalogExtrasDDL},
		{"features", catalogFeaturesDDL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgx.Connect(ctx, testenv.Database(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close(context.Background()) }()
			if _, err := conn.Exec(ctx, tc.ddl); err != nil {
				t.Fatalf("running the DDL: %v", err)
			}
			fromDB, err := LoadCatalog(ctx, conn)
			if err != nil {
				t.Fatalf("LoadCatalog: %v", err)
			}
			fromDDL, err := LoadDDL(tc.ddl)
			if err != nil {
				t.Fatalf("LoadDDL: %v", err)
			}
			catalogCompare(t, fromDB, fromDDL)
		})
	}
}

// catalogCompare checks that two schemas agree on everything but the text
// of view queries, which pg_get_viewdef spells its own way.
func catalogCompare(t *testing.T, fromDB, fromDDL *Schema) {
	t.Helper()
	if got, want := catalogKeysOf(fromDB.Tables), catalogKeysOf(fromDDL.Tables); !reflect.DeepEqual(got, want) {
		t.Errorf("tables: catalog %v, DDL %v", got, want)
	}
	for name, db := range fromDB.Tables {
		ddl := fromDDL.Tables[name]
		if db.RunsCode {
			// Only the catalog knows triggers, rules, policies and
			// inheritance (TestRunsCode checks it).
			c := *db
			c.RunsCode = false
			db = &c
		}
		if ddl != nil && !reflect.DeepEqual(db, ddl) {
			t.Errorf("table %s:\ncatalog %s\nDDL     %s", name, ddlJSON(db), ddlJSON(ddl))
		}
	}
	if got, want := catalogKeysOf(fromDB.Views), catalogKeysOf(fromDDL.Views); !reflect.DeepEqual(got, want) {
		t.Errorf("views: catalog %v, DDL %v", got, want)
	}
	for name, v := range fromDB.Views {
		if v.Name != name || strings.TrimSpace(v.Query) == "" || strings.HasSuffix(v.Query, ";") {
			t.Errorf("view %s: %+v", name, v)
		}
	}
	if !reflect.DeepEqual(fromDB.Functions, fromDDL.Functions) {
		t.Errorf("functions: catalog %v, DDL %v", fromDB.Functions, fromDDL.Functions)
	}
	if !reflect.DeepEqual(fromDB.SearchPath, fromDDL.SearchPath) {
		t.Errorf("search path: catalog %v, DDL %v", fromDB.SearchPath, fromDDL.SearchPath)
	}
}

func catalogKeysOf[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestLoadCatalogDetails checks what the comparison with LoadDDL cannot: a
// search path set on the connection, other sessions' temporary tables,
// views' query text, and loading inside the caller's transaction.
func TestLoadCatalogDetails(t *testing.T) {
	srv := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testenv.Database(t, srv)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close(context.Background()) }()
	if _, err := other.Exec(ctx, `CREATE TEMP TABLE theirs (id int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `
CREATE SCHEMA app;
CREATE TABLE app.items (id int PRIMARY KEY, price numeric);
CREATE VIEW app.cheap AS SELECT id FROM app.items WHERE price < 10;
CREATE TEMP TABLE mine (id int);
SET search_path = app, public`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CREATE TABLE app.uncommitted (id int)`); err != nil {
		t.Fatal(err)
	}
	s, err := LoadCatalog(ctx, conn)
	if err != nil {
		t.Fatalf("LoadCatalog: %v", err)
	}
	if want := []string{"app", "public"}; !reflect.DeepEqual(s.SearchPath, want) {
		t.Errorf("search path %v, want %v", s.SearchPath, want)
	}
	if got, want := catalogKeysOf(s.Tables), []string{"app.items", "app.mine", "app.uncommitted"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tables %v, want %v (this session's temporary table under the search path's first schema, not another session's)", got, want)
	}
	if mine := s.Tables["app.mine"]; mine == nil || !mine.Temporary {
		t.Errorf("app.mine: %+v, want a temporary table", mine)
	}
	if q, _, v := s.Resolve("", "cheap"); v == nil || q != "app.cheap" || !strings.Contains(v.Query, "price < 10") {
		t.Errorf("Resolve(cheap) = %s, %+v", q, v)
	}
	if tx.Conn().PgConn().TxStatus() != 'T' {
		t.Errorf("LoadCatalog ended the caller's transaction")
	}
}

// The catalog marks the tables that run user code; a statement touching
// one, or calling a function that may change the session, is not
// session-neutral.
func TestRunsCode(t *testing.T) {
	srv := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Database(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, `
CREATE TABLE plain (id int PRIMARY KEY, n int DEFAULT 0, made timestamptz DEFAULT now(), s serial);
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('app.x', '1', false); RETURN NEW; END $$;
CREATE FUNCTION pick() RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE TABLE trig (id int PRIMARY KEY);
CREATE TRIGGER t BEFORE INSERT ON trig FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TABLE ruled (id int PRIMARY KEY);
CREATE RULE r AS ON INSERT TO ruled DO ALSO NOTIFY ruled;
CREATE TABLE secured (id int PRIMARY KEY);
ALTER TABLE secured ENABLE ROW LEVEL SECURITY;
CREATE TABLE defaulted (id int PRIMARY KEY, n int DEFAULT pick());
CREATE TABLE parted (id int, PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);
CREATE TRIGGER t BEFORE INSERT ON parted_1 FOR EACH ROW EXECUTE FUNCTION touch();
CREATE TABLE parent (id int);
CREATE TABLE kid () INHERITS (parent);`); err != nil {
		t.Fatal(err)
	}
	s, err := LoadCatalog(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"plain": false, "trig": true, "ruled": true, "secured": true, "defaulted": true, "parted": true, "parent": true, "kid": false} {
		if got := s.Tables["public."+name].RunsCode; got != want {
			t.Errorf("%s: RunsCode %v, want %v", name, got, want)
		}
	}
	a := NewAnalyzer(s, nil)
	for sql, want := range map[string]bool{
		"INSERT INTO plain (id) VALUES ($1)":                          true,
		"UPDATE plain SET n = n + 1, made = now() WHERE id = $1":      true,
		"SELECT n FROM plain WHERE id = $1 FOR UPDATE":                true,
		"DELETE FROM plain WHERE id = $1 RETURNING lower('X')":        true,
		"WITH x AS (SELECT id FROM plain) SELECT * FROM x":            true,
		"INSERT INTO trig VALUES ($1)":                                false,
		"INSERT INTO ruled VALUES ($1)":                               false,
		"SELECT * FROM secured":                                       false,
		"INSERT INTO defaulted (id) VALUES ($1)":                      false,
		"INSERT INTO parted VALUES ($1)":                              false,
		"UPDATE parent SET id = 2":                                    false,
		"SELECT set_config('app.x', '2', false)":                      false,
		"SELECT pick()":                                               false,
		"SELECT * FROM plain WHERE n = pick()":                        false,
		"SET search_path = other":                                     false,
		"SET ROLE nobody":                                             false,
		"DO $$ BEGIN PERFORM set_config('app.x', '3', false); END $$": false,
		"SELECT * FROM generate_series(1, 3)":                         false,
		"INSERT INTO nowhere VALUES (1)":                              false,
	} {
		tpl, err := a.Prepare(sql)
		if err != nil {
			t.Errorf("%s: %v", sql, err)
			continue
		}
		if tpl.SessionNeutral != want {
			t.Errorf("%s: SessionNeutral %v, want %v", sql, tpl.SessionNeutral, want)
		}
	}
}

// A name parameter's canonical text is what PostgreSQL stores: truncated
// to 63 bytes at a character boundary.
func TestNameCanonicalMatchesPostgres(t *testing.T) {
	srv := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Database(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for _, v := range []string{"short", strings.Repeat("a", 63), strings.Repeat("b", 70), strings.Repeat("é", 40), "x" + strings.Repeat("é", 40), strings.Repeat("€", 30)} {
		var want string
		if err := conn.QueryRow(ctx, "SELECT $1::text::name::text", v).Scan(&want); err != nil {
			t.Fatal(err)
		}
		got, ok := canonical("name", v)
		if !ok || got != want {
			t.Errorf("canonical(name, %d bytes) = %q (%v), PostgreSQL stores %q", len(v), got, ok, want)
		}
	}
}
