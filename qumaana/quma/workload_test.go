package quma

import (
	"errors"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

func TestReadTemplates(t *testing.T) {
	in := `-- a comment
SELECT * FROM inv WHERE id=? AND name = ?; /* block
comment */ SELECT qty FROM inv
  WHERE name = $1;
select qty  from inv where name = $1 -- the same template again
;
SELECT data ?? 'k', '?' FROM docs WHERE id = ?;
`
	sts, err := ReadTemplates(strings.NewReader(in), "t.sql")
	if err != nil {
		t.Fatal(err)
	}
	want := []Statement{
		{SQL: "SELECT qty FROM inv WHERE name = $1", Frequency: 2, Source: "t.sql:3"},
		{SQL: "SELECT * FROM inv WHERE id= $1 AND name = $2", Frequency: 1, Source: "t.sql:2"},
		{SQL: "SELECT data ? 'k', '?' FROM docs WHERE id = $1", Frequency: 1, Source: "t.sql:7"},
	}
	if len(sts) != len(want) {
		t.Fatalf("got %d statements %+v, want %d", len(sts), sts, len(want))
	}
	for i := range want {
		if sts[i] != want[i] {
			t.Errorf("statement %d: got %+v, want %+v", i, sts[i], want[i])
		}
	}
}

func TestReadTemplatesErrors(t *testing.T) {
	cases := []struct {
		in, want string
		line     int
	}{
		{"SELECT 1;\n\nSELECT * FROM t WHERE a = ;\n", "syntax error", 3},
		{"SELECT 1;\nSELECT *\nFROM t\nWHERE WHERE a = 1;", "syntax error", 4},
		{"SELECT 'unterminated", "unterminated", 1},
		{"SELECT * FROM t WHERE a = $1 AND b = ?;", "mixes $n and ?", 0},
		{"x\x00y", "NUL byte", 0},
	}
	for _, c := range cases {
		_, err := ReadTemplates(strings.NewReader(c.in), "t.sql")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err %v, want %q", c.in, err, c.want)
			continue
		}
		var se *SyntaxError
		if c.line > 0 {
			if !errors.As(err, &se) || se.Line != c.line {
				t.Errorf("%q: err %v: want a syntax error at line %d", c.in, err, c.line)
			}
		}
	}
	for _, in := range []string{"", "-- only a comment\n;;\n", "  \n/* nothing */"} {
		if sts, err := ReadTemplates(strings.NewReader(in), "t.sql"); !errors.Is(err, ErrNoTemplates) {
			t.Errorf("%q: %v, %v; want ErrNoTemplates", in, sts, err)
		}
	}
	big := "SELECT * FROM t WHERE id IN (" + strings.Repeat("1,", MaxStatementBytes/2) + "1)"
	if _, err := ReadTemplates(strings.NewReader("SELECT 1;\n"+big), "t.sql"); err == nil || !strings.Contains(err.Error(), "t.sql:2: a statement of") {
		t.Errorf("a statement over MaxStatementBytes: %v", err)
	}
	if _, err := ReadTemplates(strings.NewReader(strings.Repeat("SELECT 1;\n", MaxTemplateFile/10+1)), "t.sql"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a template file over MaxTemplateFile: %v", err)
	}
}

const stderrLog = `2026-11-20 10:00:00.001 UTC [101] LOG:  statement: BEGIN
2026-11-20 10:00:00.002 UTC [101] LOG:  statement: SELECT * FROM items WHERE id = 42
2026-11-20 10:00:00.003 UTC [101] LOG:  statement: SELECT * FROM items WHERE id = 7
2026-11-20 10:00:00.004 UTC [101] LOG:  statement: SELECT name
		FROM users
	WHERE id = 'x''y'
2026-11-20 10:00:00.005 UTC [102] LOG:  execute <unnamed>: SELECT * FROM items WHERE id = $1
2026-11-20 10:00:00.005 UTC [102] DETAIL:  parameters: $1 = '9'
2026-11-20 10:00:00.006 UTC [102] LOG:  duration: 0.050 ms  parse S_1: SELECT * FROM bids WHERE item_id = $1
2026-11-20 10:00:00.007 UTC [102] LOG:  duration: 0.150 ms  execute S_1: SELECT * FROM bids WHERE item_id = $1
2026-11-20 10:00:00.008 UTC [101] LOG:  statement: SELEC broken
2026-11-20 10:00:00.009 UTC [101] LOG:  statement: COMMIT
2026-11-20 10:00:00.010 UTC [101] ERROR:  relation "nope" does not exist
2026-11-20 10:00:00.011 UTC [101] LOG:  duration: 1.000 ms
2026-11-20 10:00:00.012 UTC [101] LOG:  statement: UPDATE items SET max_bid = 3.5 WHERE id = 1; SELECT 1
`

func TestReadServerLogStderr(t *testing.T) {
	sts, warns, err := ReadServerLog(strings.NewReader(stderrLog), "pg.log")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Statement{}
	for _, s := range sts {
		got[s.SQL] = s
	}
	want := map[string]int64{
		"SELECT * FROM items WHERE id = $1":           3,
		"SELECT name\n\tFROM users\nWHERE id = $1":    1,
		"SELECT * FROM bids WHERE item_id = $1":       1,
		"UPDATE items SET max_bid = $1 WHERE id = $2": 1,
		"SELECT $1": 1,
	}
	if len(got) != len(want) {
		t.Errorf("got %d templates, want %d: %+v", len(got), len(want), sts)
	}
	for sql, f := range want {
		if got[sql].Frequency != f {
			t.Errorf("%q: frequency %d, want %d (got %+v)", sql, got[sql].Frequency, f, sts)
		}
	}
	if sts[0].SQL != "SELECT * FROM items WHERE id = $1" || sts[0].Source != "pg.log:2" {
		t.Errorf("most frequent first, with its first source: %+v", sts[0])
	}
	joined := strings.Join(warns, "\n")
	for _, w := range []string{"pg.log:11: skipped: does not parse", "skipped 2 utility statements"} {
		if !strings.Contains(joined, w) {
			t.Errorf("warnings lack %q:\n%s", w, joined)
		}
	}
}

func TestReadServerLogCSV(t *testing.T) {
	in := `2026-11-20 10:00:00.001 UTC,"app","db",101,"[local]",6553a1.65,1,"idle",2026-11-20 09:59:00 UTC,3/2,0,LOG,00000,"statement: SELECT * FROM items
WHERE id = 5",,,,,,,,,"psql","client backend",,0
2026-11-20 10:00:00.002 UTC,"app","db",101,"[local]",6553a1.65,2,"idle",2026-11-20 09:59:00 UTC,3/3,0,LOG,00000,"statement: SELECT * FROM items WHERE id = 6",,,,,,,,,"psql","client backend",,0
2026-11-20 10:00:00.003 UTC,"app","db",101,"[local]",6553a1.65,3,"idle",2026-11-20 09:59:00 UTC,3/4,0,ERROR,42P01,"relation ""x"" does not exist",,,,,,"SELECT * FROM x",15,,"psql","client backend",,0
`
	sts, _, err := ReadServerLog(strings.NewReader(in), "pg.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 1 || sts[0].Frequency != 2 || sts[0].SQL != "SELECT * FROM items\nWHERE id = $1" || sts[0].Source != "pg.csv:1" {
		t.Fatalf("got %+v", sts)
	}
}

func TestReadServerLogNothing(t *testing.T) {
	_, warns, err := ReadServerLog(strings.NewReader("2026-11-20 LOG:  checkpoint starting\n"), "pg.log")
	if err != nil || len(warns) == 0 || !strings.Contains(warns[len(warns)-1], "log_statement=all") {
		t.Errorf("a log without statements: warns %v, err %v", warns, err)
	}
	if _, _, err := ReadServerLog(strings.NewReader(""), "pg.log"); err == nil {
		t.Error("an empty log: no error")
	}
}

func TestReadPGSS(t *testing.T) {
	csvIn := "userid,dbid,query,calls,total_exec_time\n" +
		"10,5,SELECT * FROM items WHERE id = $1,1200,3.5\n" +
		"10,5,\"SELECT name\nFROM users WHERE id = $1\",30,1\n" +
		"10,5,SELECT * FROM items WHERE  id = $1,5,1\n" +
		"10,5,\"SELECT * FROM items WHERE id = $1 AND name = (SELECT na\",2,1\n" +
		"10,5,BEGIN,900,0\n"
	sts, warns, err := ReadPGSS(strings.NewReader(csvIn), "pgss.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 2 || sts[0].Frequency != 1205 || sts[1].Frequency != 30 || sts[1].SQL != "SELECT name\nFROM users WHERE id = $1" {
		t.Fatalf("got %+v", sts)
	}
	joined := strings.Join(warns, "\n")
	if !strings.Contains(joined, "pgss.csv:row 5: skipped") || !strings.Contains(joined, "1 utility") {
		t.Errorf("warnings: %s", joined)
	}

	tsv := "query\tcalls\nSELECT * FROM bids\\n WHERE item_id = $1\t7\n"
	sts, _, err = ReadPGSS(strings.NewReader(tsv), "pgss.tsv")
	if err != nil || len(sts) != 1 || sts[0].SQL != "SELECT * FROM bids\n WHERE item_id = $1" || sts[0].Frequency != 7 {
		t.Fatalf("tsv: %+v, %v", sts, err)
	}

	for in, want := range map[string]string{
		"":                    "empty",
		"userid,calls\n1,2\n": `no "query" column`,
		"query\tcalls\nx\\":   "backslash",
	} {
		if _, _, err := ReadPGSS(strings.NewReader(in), "p"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want %q", in, err, want)
		}
	}
	_, warns, err = ReadPGSS(strings.NewReader("query,calls\nSELECT 1,many\n"), "p")
	if err != nil || len(warns) != 1 || !strings.Contains(warns[0], "not a count") {
		t.Errorf("bad calls: %v %v", warns, err)
	}
}

// The workload readers never panic and every statement they return parses.
func FuzzReadTemplates(f *testing.F) {
	for _, s := range []string{
		"SELECT * FROM t WHERE a=? AND b = ?;",
		"SELECT $1; -- c\n/* d */ SELECT 'x?' ;",
		"SELECT data ?? 'k' FROM t",
		"SELECT 'open",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		sts, err := ReadTemplates(strings.NewReader(in), "f")
		if err != nil {
			return
		}
		for _, s := range sts {
			if _, perr := pg.Parse(s.SQL); perr != nil {
				t.Fatalf("%q: returned %q which does not parse: %v", in, s.SQL, perr)
			}
			if s.Frequency < 1 {
				t.Fatalf("frequency %d", s.Frequency)
			}
		}
	})
}

func FuzzReadServerLog(f *testing.F) {
	f.Add(stderrLog)
	f.Add("a,b,c,d,e,f,g,h,i,j,k,LOG,m,\"statement: SELECT 1\"\n")
	f.Fuzz(func(t *testing.T, in string) {
		sts, _, err := ReadServerLog(strings.NewReader(in), "f")
		if err != nil {
			return
		}
		for _, s := range sts {
			if _, perr := pg.Parse(s.SQL); perr != nil {
				t.Fatalf("returned %q which does not parse: %v", s.SQL, perr)
			}
		}
	})
}
