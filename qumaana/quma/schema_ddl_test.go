package quma

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// ddlCols builds columns from "name type" specs; a trailing "!" marks NOT NULL.
func ddlCols(specs ...string) []Column {
	cols := make([]Column, len(specs))
	for i, s := range specs {
		name, typ, _ := strings.Cut(s, " ")
		cols[i] = Column{Name: name, Type: strings.TrimSuffix(typ, "!"), NotNull: strings.HasSuffix(typ, "!")}
	}
	return cols
}

func ddlJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func TestLoadDDL(t *testing.T) {
	cases := []struct {
		name  string
		ddl   string
		want  map[string]*Table     // tables to compare in full
		views map[string]string     // view → its query text
		funcs map[string]Volatility // the whole Functions map, when not nil
		err   string                // expected error substring
	}{
		{
			name: "types",
			ddl: `CREATE TABLE t (a integer, b int, c int4, d bigint, e int8, f smallint, g int2,
				h varchar(3), i character varying, j char(2), k character, l text, m boolean, n bool,
				o real, p float4, q double precision, r float8, s float, t numeric(5,2), u decimal,
				v timestamp, w timestamptz, x timestamp with time zone, y date, z time, aa uuid,
				ab bytea, ac json, ad jsonb, ae int[], af text[][], ag "char", ah interval,
				ai time with time zone, aj bpchar, ak pg_catalog.int8, al citext, am "MyType")`,
			want: map[string]*Table{"public.t": {
				Name: "public.t",
				Columns: ddlCols("a int4", "b int4", "c int4", "d int8", "e int8", "f int2", "g int2",
					"h varchar", "i varchar", "j bpchar", "k bpchar", "l text", "m bool", "n bool",
					"o float4", "p float4", "q float8", "r float8", "s float8", "t numeric", "u numeric",
					"v timestamp", "w timestamptz", "x timestamptz", "y date", "z time", "aa uuid",
					"ab bytea", "ac json", "ad jsonb", "ae _int4", "af _text", "ag char", "ah interval",
					"ai timetz", "aj bpchar", "ak int8", "al citext", "am MyType"),
				ReplicaIdentity: "default",
			}},
		},
		{
			name: "serial and keys",
			ddl: `CREATE TABLE t (id serial PRIMARY KEY, b bigserial, s smallserial, code text UNIQUE,
				x int, y int, z int NOT NULL, UNIQUE (x, y), UNIQUE (y, x), UNIQUE (id), CONSTRAINT zu UNIQUE (z))`,
			want: map[string]*Table{"public.t": {
				Name:            "public.t",
				Columns:         ddlCols("id int4!", "b int8!", "s int2!", "code text", "x int4", "y int4", "z int4!"),
				PrimaryKey:      []string{"id"},
				UniqueKeys:      [][]string{{"code"}, {"x", "y"}, {"z"}},
				ReplicaIdentity: "default",
				IdentityColumns: []string{"id"},
			}},
		},
		{
			name: "table primary key",
			ddl:  `CREATE TABLE t (a int, b text, c int, PRIMARY KEY (b, a)); CREATE TABLE u (a int GENERATED ALWAYS AS IDENTITY, b int NULL)`,
			want: map[string]*Table{
				"public.t": {
					Name:            "public.t",
					Columns:         ddlCols("a int4!", "b text!", "c int4"),
					PrimaryKey:      []string{"b", "a"},
					ReplicaIdentity: "default",
					IdentityColumns: []string{"b", "a"},
				},
				"public.u": {Name: "public.u", Columns: ddlCols("a int4!", "b int4"), ReplicaIdentity: "default"},
			},
		},
		{
			name: "unique indexes",
			ddl: `CREATE TABLE t (id int PRIMARY KEY, a int, b int, c text);
				CREATE INDEX t_a ON t (a);
				CREATE UNIQUE INDEX t_b ON t (b);
				CREATE UNIQUE INDEX t_ab ON t USING btree (a DESC, b) INCLUDE (c);
				CREATE UNIQUE INDEX t_partial ON t (c) WHERE a > 0;
				CREATE UNIQUE INDEX t_expr ON t (lower(c));
				CREATE UNIQUE INDEX t_mixed ON t (a, lower(c));
				CREATE UNIQUE INDEX t_pk_again ON t (id);
				CREATE UNIQUE INDEX IF NOT EXISTS t_b ON t (c);
				CREATE UNIQUE INDEX ON t (c, a);`,
			want: map[string]*Table{"public.t": {
				Name:            "public.t",
				Columns:         ddlCols("id int4!", "a int4", "b int4", "c text"),
				PrimaryKey:      []string{"id"},
				UniqueKeys:      [][]string{{"b"}, {"a", "b"}, {"c", "a"}},
				ReplicaIdentity: "default",
				IdentityColumns: []string{"id"},
			}},
		},
		{
			name: "alter table keys",
			ddl: `CREATE TABLE t (a int, b int, c int, d int);
				ALTER TABLE ONLY t ADD CONSTRAINT t_pk PRIMARY KEY (a);
				ALTER TABLE t ADD CONSTRAINT t_b UNIQUE (b), ADD UNIQUE (c, d);
				ALTER TABLE t OWNER TO someone;
				ALTER TABLE t ALTER COLUMN d SET NOT NULL, ALTER COLUMN d TYPE bigint;
				ALTER TABLE t ADD COLUMN e uuid UNIQUE NOT NULL;
				ALTER TABLE IF EXISTS missing ADD PRIMARY KEY (x);`,
			want: map[string]*Table{"public.t": {
				Name:            "public.t",
				Columns:         ddlCols("a int4!", "b int4", "c int4", "d int8!", "e uuid!"),
				PrimaryKey:      []string{"a"},
				UniqueKeys:      [][]string{{"b"}, {"c", "d"}, {"e"}},
				ReplicaIdentity: "default",
				IdentityColumns: []string{"a"},
			}},
		},
		{
			name: "replica identity",
			ddl: `CREATE TABLE f (id int PRIMARY KEY, v text); ALTER TABLE f REPLICA IDENTITY FULL;
				CREATE TABLE n (id int PRIMARY KEY); ALTER TABLE n REPLICA IDENTITY NOTHING;
				CREATE TABLE d (id int PRIMARY KEY); ALTER TABLE d REPLICA IDENTITY FULL; ALTER TABLE d REPLICA IDENTITY DEFAULT;
				CREATE TABLE i (id int PRIMARY KEY, a int NOT NULL, b int NOT NULL);
				CREATE UNIQUE INDEX i_ab ON i (a, b);
				ALTER TABLE i REPLICA IDENTITY USING INDEX i_ab;
				CREATE TABLE c (id int, code text NOT NULL UNIQUE);
				ALTER TABLE c REPLICA IDENTITY USING INDEX c_code_key;
				CREATE TABLE nopk (a int);
				CREATE TABLE later (a int); ALTER TABLE later ADD PRIMARY KEY (a);`,
			want: map[string]*Table{
				"public.f": {Name: "public.f", Columns: ddlCols("id int4!", "v text"), PrimaryKey: []string{"id"}, ReplicaIdentity: "full", IdentityColumns: []string{"id", "v"}},
				"public.n": {Name: "public.n", Columns: ddlCols("id int4!"), PrimaryKey: []string{"id"}, ReplicaIdentity: "nothing"},
				"public.d": {Name: "public.d", Columns: ddlCols("id int4!"), PrimaryKey: []string{"id"}, ReplicaIdentity: "default", IdentityColumns: []string{"id"}},
				"public.i": {
					Name: "public.i", Columns: ddlCols("id int4!", "a int4!", "b int4!"), PrimaryKey: []string{"id"},
					UniqueKeys: [][]string{{"a", "b"}}, ReplicaIdentity: "index", IdentityColumns: []string{"a", "b"},
				},
				"public.c": {
					Name: "public.c", Columns: ddlCols("id int4", "code text!"),
					UniqueKeys: [][]string{{"code"}}, ReplicaIdentity: "index", IdentityColumns: []string{"code"},
				},
				"public.nopk":  {Name: "public.nopk", Columns: ddlCols("a int4"), ReplicaIdentity: "default"},
				"public.later": {Name: "public.later", Columns: ddlCols("a int4!"), PrimaryKey: []string{"a"}, ReplicaIdentity: "default", IdentityColumns: []string{"a"}},
			},
		},
		{
			name: "temporary and qualified tables",
			ddl: `CREATE TEMP TABLE scratch (id int PRIMARY KEY);
				CREATE TEMPORARY TABLE IF NOT EXISTS scratch (x int);
				CREATE TABLE pg_temp.scratch2 (id int);
				CREATE SCHEMA shop;
				CREATE TABLE shop.orders (id bigint PRIMARY KEY, "Total" numeric);
				CREATE UNIQUE INDEX ON shop.orders ("Total");
				CREATE SCHEMA crm CREATE TABLE contacts (id int);`,
			want: map[string]*Table{
				"public.scratch":  {Name: "public.scratch", Columns: ddlCols("id int4!"), PrimaryKey: []string{"id"}, ReplicaIdentity: "default", IdentityColumns: []string{"id"}, Temporary: true},
				"public.scratch2": {Name: "public.scratch2", Columns: ddlCols("id int4"), ReplicaIdentity: "default", Temporary: true},
				"shop.orders": {
					Name: "shop.orders", Columns: ddlCols("id int8!", "Total numeric"), PrimaryKey: []string{"id"},
					UniqueKeys: [][]string{{"Total"}}, ReplicaIdentity: "default", IdentityColumns: []string{"id"},
				},
				"crm.contacts": {Name: "crm.contacts", Columns: ddlCols("id int4"), ReplicaIdentity: "default"},
			},
		},
		{
			name: "ignored statements",
			ddl: `SET search_path = public;
				SELECT pg_catalog.set_config('search_path', '', false);
				CREATE EXTENSION IF NOT EXISTS pgcrypto;
				CREATE SEQUENCE s START 10;
				CREATE TABLE t (id int PRIMARY KEY);
				COMMENT ON TABLE t IS 'a table';
				GRANT SELECT ON t TO PUBLIC;
				INSERT INTO t VALUES (1);
				CREATE TABLE copy AS SELECT * FROM t;
				ALTER TABLE ONLY public.t ALTER COLUMN id SET DEFAULT nextval('s');
				ALTER TABLE public.s OWNER TO postgres;
				CREATE PROCEDURE p() LANGUAGE sql AS 'SELECT 1';
				DROP TABLE IF EXISTS nothing_here;`,
			want: map[string]*Table{"public.t": {
				Name: "public.t", Columns: ddlCols("id int4!"), PrimaryKey: []string{"id"},
				ReplicaIdentity: "default", IdentityColumns: []string{"id"},
			}},
			funcs: map[string]Volatility{},
		},
		{
			name: "views",
			ddl: `CREATE TABLE users (id int PRIMARY KEY, name text, rating int);
				CREATE VIEW good_users AS SELECT id, name FROM users WHERE rating > 5;
				CREATE OR REPLACE VIEW good_users AS SELECT id, name FROM users WHERE rating > 4;
				CREATE VIEW renamed (uid, uname) AS SELECT id, name AS n FROM users;
				CREATE VIEW starred (a) AS SELECT * FROM users;
				CREATE VIEW ordered (x) AS SELECT name FROM users ORDER BY name;
				CREATE MATERIALIZED VIEW shop.stats AS SELECT count(*) AS n FROM users;
				CREATE UNIQUE INDEX ON shop.stats (n);
				CREATE VIEW gone AS SELECT 1; DROP VIEW gone;`,
			views: map[string]string{
				"public.good_users": "SELECT id, name FROM users WHERE rating > 4",
				"public.renamed":    "SELECT id AS uid, name AS uname FROM users",
				"public.starred":    "SELECT * FROM (SELECT * FROM users) starred(a)",
				"public.ordered":    "SELECT * FROM (SELECT name FROM users ORDER BY name) ordered(x)",
				"shop.stats":        "SELECT count(*) AS n FROM users",
			},
		},
		{
			name: "functions",
			ddl: `CREATE FUNCTION add1(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1';
				CREATE FUNCTION shop.price(id int, OUT p numeric) LANGUAGE sql STABLE AS 'SELECT 1';
				CREATE FUNCTION rnd() RETURNS float8 LANGUAGE sql AS 'SELECT random()';
				CREATE FUNCTION over(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1';
				CREATE FUNCTION over(text) RETURNS int LANGUAGE sql STABLE AS 'SELECT 1';
				CREATE FUNCTION later(int) RETURNS int LANGUAGE sql AS 'SELECT 1';
				ALTER FUNCTION later(integer) IMMUTABLE;
				CREATE OR REPLACE FUNCTION repl() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 1';
				CREATE OR REPLACE FUNCTION repl() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1';
				CREATE FUNCTION dropped() RETURNS int LANGUAGE sql AS 'SELECT 1';
				DROP FUNCTION dropped();
				CREATE PROCEDURE proc() LANGUAGE sql AS 'SELECT 1';`,
			funcs: map[string]Volatility{
				"public.add1": Immutable, "shop.price": Stable, "public.rnd": Volatile,
				"public.over": Stable, "public.later": Immutable, "public.repl": Stable,
			},
		},
		{
			name: "inheritance, partitions, like, domains",
			ddl: `CREATE DOMAIN money_t AS numeric(10,2);
				CREATE DOMAIN positive AS money_t CHECK (VALUE > 0);
				CREATE TABLE m (id int, region text NOT NULL, amount positive, tags money_t[], PRIMARY KEY (id, region)) PARTITION BY LIST (region);
				CREATE UNIQUE INDEX m_amount ON m (amount, region);
				CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu');
				CREATE TABLE base (id int NOT NULL, note text);
				CREATE TABLE child (extra int) INHERITS (base);
				CREATE TABLE lk (LIKE m INCLUDING INDEXES, more int);
				ALTER TABLE base ADD COLUMN added int;`,
			want: map[string]*Table{
				"public.m": {
					Name: "public.m", Columns: ddlCols("id int4!", "region text!", "amount numeric", "tags _money_t"),
					PrimaryKey: []string{"id", "region"}, UniqueKeys: [][]string{{"amount", "region"}},
					ReplicaIdentity: "default", IdentityColumns: []string{"id", "region"},
				},
				"public.m_eu": {
					Name: "public.m_eu", Columns: ddlCols("id int4!", "region text!", "amount numeric", "tags _money_t"),
					PrimaryKey: []string{"id", "region"}, UniqueKeys: [][]string{{"amount", "region"}},
					ReplicaIdentity: "default", IdentityColumns: []string{"id", "region"},
				},
				"public.base":  {Name: "public.base", Columns: ddlCols("id int4!", "note text", "added int4"), ReplicaIdentity: "default"},
				"public.child": {Name: "public.child", Columns: ddlCols("id int4!", "note text", "extra int4", "added int4"), ReplicaIdentity: "default"},
				"public.lk": {
					Name: "public.lk", Columns: ddlCols("id int4!", "region text!", "amount numeric", "tags _money_t", "more int4"),
					PrimaryKey: []string{"id", "region"}, UniqueKeys: [][]string{{"amount", "region"}},
					ReplicaIdentity: "default", IdentityColumns: []string{"id", "region"},
				},
			},
		},
		{
			name: "drop and rename",
			ddl: `CREATE TABLE a (id int PRIMARY KEY, x int UNIQUE, y int, z int);
				CREATE UNIQUE INDEX a_y ON a (y);
				CREATE UNIQUE INDEX a_z ON a (z);
				DROP INDEX a_y;
				ALTER TABLE a DROP CONSTRAINT a_x_key;
				ALTER TABLE a RENAME COLUMN z TO zz;
				ALTER INDEX a_z RENAME TO a_zz;
				ALTER TABLE a REPLICA IDENTITY USING INDEX a_zz;
				ALTER TABLE a RENAME TO b;
				CREATE TABLE gone (id int); DROP TABLE gone;
				CREATE TABLE cols (a int, b int, c int, UNIQUE (a, b)); ALTER TABLE cols DROP COLUMN b;`,
			want: map[string]*Table{
				"public.b": {
					Name: "public.b", Columns: ddlCols("id int4!", "x int4", "y int4", "zz int4"), PrimaryKey: []string{"id"},
					UniqueKeys: [][]string{{"zz"}}, ReplicaIdentity: "index", IdentityColumns: []string{"zz"},
				},
				"public.cols": {Name: "public.cols", Columns: ddlCols("a int4", "c int4"), ReplicaIdentity: "default"},
			},
		},
		{name: "syntax error", ddl: "CREATE TABLE t (id int);\nCREATE TABLE u (id int,, x int);", err: "line 2, column 24"},
		{name: "syntax error after non-ASCII", ddl: "-- héhé\nCREATE TABLE é (id int) garbage;", err: "line 2, column 25"},
		{name: "key on missing column", ddl: "CREATE TABLE t (id int);\n  ALTER TABLE t ADD PRIMARY KEY (nope);", err: "line 2"},
		{name: "two primary keys", ddl: "CREATE TABLE t (id int PRIMARY KEY, b int, PRIMARY KEY (b));", err: "multiple primary keys"},
		{name: "unknown replica identity index", ddl: "CREATE TABLE t (id int PRIMARY KEY);\nALTER TABLE t REPLICA IDENTITY USING INDEX nope;", err: "line 2, column 13"},
		{name: "non-unique replica identity index", ddl: "CREATE TABLE t (id int PRIMARY KEY); CREATE INDEX t_i ON t (id); ALTER TABLE t REPLICA IDENTITY USING INDEX t_i;", err: "not a unique index"},
		{name: "alter unknown table", ddl: "ALTER TABLE nope ADD PRIMARY KEY (id);", err: "line 1, column 13: relation public.nope does not exist"},
		{name: "duplicate table", ddl: "CREATE TABLE t (id int);\n/* again */ CREATE TABLE t (id int);", err: "line 2, column 26"},
		{name: "index on unknown column", ddl: "CREATE TABLE t (id int); CREATE UNIQUE INDEX ON t (nope);", err: `column "nope" does not exist`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := LoadDDL(tc.ddl)
			if tc.err != "" {
				if err == nil {
					t.Fatalf("LoadDDL succeeded, want error containing %q", tc.err)
				}
				if !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "quma: ") {
					t.Fatalf("error %q, want it to start with \"quma: \" and contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadDDL: %v", err)
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			for name, want := range tc.want {
				if got := s.Tables[name]; !reflect.DeepEqual(got, want) {
					t.Errorf("table %s:\ngot  %s\nwant %s", name, ddlJSON(got), ddlJSON(want))
				}
			}
			if tc.views != nil {
				got := map[string]string{}
				for name, v := range s.Views {
					if v.Name != name {
						t.Errorf("view %q stored under %q", v.Name, name)
					}
					if _, err := pg.Parse(v.Query); err != nil {
						t.Errorf("view %s: query %q does not parse: %v", name, v.Query, err)
					}
					got[name] = v.Query
				}
				if !reflect.DeepEqual(got, tc.views) {
					t.Errorf("views:\ngot  %s\nwant %s", ddlJSON(got), ddlJSON(tc.views))
				}
			}
			if tc.funcs != nil && !reflect.DeepEqual(s.Functions, tc.funcs) {
				t.Errorf("functions:\ngot  %v\nwant %v", s.Functions, tc.funcs)
			}
			if !reflect.DeepEqual(s.SearchPath, []string{"public"}) {
				t.Errorf("search path %v", s.SearchPath)
			}
		})
	}
}

func TestLoadDDLSyntaxErrorIsSyntaxError(t *testing.T) {
	_, err := LoadDDL("CREATE TABLE t (id int);\n\n  SELEC 1;")
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T), want a *SyntaxError", err, err)
	}
	if se.Line != 3 || se.Column != 3 || se.Offset != 28 {
		t.Errorf("position line %d column %d offset %d, want line 3 column 3 offset 28", se.Line, se.Column, se.Offset)
	}
}

func TestLoadDDLEmpty(t *testing.T) {
	for _, ddl := range []string{"", "  -- nothing\n", ";;"} {
		s, err := LoadDDL(ddl)
		if err != nil {
			t.Fatalf("LoadDDL(%q): %v", ddl, err)
		}
		if len(s.Tables) != 0 || len(s.Views) != 0 || len(s.Functions) != 0 {
			t.Errorf("LoadDDL(%q) = %s, want an empty schema", ddl, ddlJSON(s))
		}
	}
}

func TestLoadDDLRUBiS(t *testing.T) {
	b, err := os.ReadFile("../testdata/rubis/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadDDL(string(b))
	if err != nil {
		t.Fatalf("LoadDDL: %v", err)
	}
	if got := len(s.Tables); got != 8 {
		t.Errorf("%d tables, want 8", got)
	}
	users := s.Tables["public.users"]
	want := &Table{
		Name: "public.users",
		Columns: ddlCols("id int4!", "firstname varchar", "lastname varchar", "nickname varchar!", "password varchar!",
			"email varchar!", "rating int4", "balance float4", "creation_date timestamp", "region int4!"),
		PrimaryKey:      []string{"id"},
		UniqueKeys:      [][]string{{"nickname"}},
		ReplicaIdentity: "default",
		IdentityColumns: []string{"id"},
	}
	if !reflect.DeepEqual(users, want) {
		t.Errorf("users:\ngot  %s\nwant %s", ddlJSON(users), ddlJSON(want))
	}
	oldItems := s.Tables["public.old_items"]
	if oldItems == nil || oldItems.Column("id").Type != "int4" || !oldItems.Column("id").NotNull ||
		oldItems.Column("reserve_price").Type != "float4" || oldItems.Column("reserve_price").NotNull {
		t.Errorf("old_items: %s", ddlJSON(oldItems))
	}
	for name, tbl := range s.Tables {
		if !reflect.DeepEqual(tbl.PrimaryKey, []string{"id"}) || tbl.ReplicaIdentity != "default" ||
			!reflect.DeepEqual(tbl.IdentityColumns, []string{"id"}) {
			t.Errorf("%s: key %v, identity %s %v", name, tbl.PrimaryKey, tbl.ReplicaIdentity, tbl.IdentityColumns)
		}
		if name != "public.users" && len(tbl.UniqueKeys) != 0 {
			t.Errorf("%s: unique keys %v", name, tbl.UniqueKeys)
		}
	}
	if got := s.Tables["public.items"].Column("description"); got == nil || got.Type != "text" {
		t.Errorf("items.description: %+v", got)
	}
}

func FuzzLoadDDL(f *testing.F) {
	for _, seed := range []string{
		"",
		"CREATE TABLE t (id serial PRIMARY KEY, name varchar(20) NOT NULL UNIQUE);",
		"CREATE TEMP TABLE t (a int, b text, PRIMARY KEY (a, b)); ALTER TABLE t REPLICA IDENTITY FULL;",
		"CREATE TABLE t (a int NOT NULL); CREATE UNIQUE INDEX i ON t (a); ALTER TABLE t REPLICA IDENTITY USING INDEX i;",
		"CREATE TABLE t (a int); ALTER TABLE t ADD CONSTRAINT c UNIQUE (a); ALTER TABLE t DROP COLUMN a;",
		"CREATE VIEW v (x) AS SELECT * FROM t; CREATE MATERIALIZED VIEW m AS SELECT 1;",
		"CREATE FUNCTION f(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1'; ALTER FUNCTION f STABLE;",
		"CREATE TABLE p (a int PRIMARY KEY) PARTITION BY RANGE (a); CREATE TABLE c PARTITION OF p FOR VALUES FROM (1) TO (2);",
		"CREATE DOMAIN d AS int; CREATE TABLE t (a d, b d[]) ; DROP TABLE t CASCADE;",
		"CREATE TABLE t (LIKE nope);",
		"CREATE TABLE é (\"Ä\" int);\nCREATE TABLE",
		"/* unterminated",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, ddl string) {
		s, err := LoadDDL(ddl)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "quma: ") {
				t.Fatalf("error without the package prefix: %v", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("LoadDDL returned an invalid schema: %v", err)
		}
	})
}
