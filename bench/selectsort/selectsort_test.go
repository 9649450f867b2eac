package main

import (
	"context"
	"strings"
	"testing"

	"github.com/larderdb/larder/internal/recipe"
	"github.com/larderdb/larder/internal/testenv"
)

// checkStructure asserts what must hold whatever the machine's speed.
func checkStructure(t *testing.T, rep *Report, rows int) {
	t.Helper()
	if rep.Rows != [2]int{rows, rows} || rep.Raw[0] != rep.Raw[1] {
		t.Fatalf("results of %v rows, %v bytes: the two queries must return the same rows", rep.Rows, rep.Raw)
	}
	raw := rep.Raw[1]
	rc := rep.scheme("recipes")
	if rc.Bytes[0] < raw {
		t.Errorf("first recipe %d bytes < raw %d: rows were referenced before the edge had them", rc.Bytes[0], raw)
	}
	if rc.Bytes[1]*20 >= raw {
		t.Errorf("second recipe %d bytes is not under 5%% of raw %d", rc.Bytes[1], raw)
	}
	if max := int64(rows*recipe.RefSize + 1000); rc.Bytes[1] > max {
		t.Errorf("second recipe %d bytes, want at most one reference per row (%d)", rc.Bytes[1], max)
	}
	if rep.Edge.Refetches+rep.Edge.FullRefetches != 0 || rep.Edge.RowsFromStore != uint64(rows) {
		t.Errorf("edge stats %+v: every row of the second query must come from the store", rep.Edge)
	}
	// Rows reordered defeat chunking: a ~4.5 KiB chunk spans several rows.
	if cdc := rep.Schemes[3]; cdc.Bytes[1]*10 < raw*9 {
		t.Errorf("CDC sent %d of %d bytes: reordered rows should defeat it", cdc.Bytes[1], raw)
	}
	if z := rep.scheme("zstd (default level)"); z.Bytes[1] <= rc.Bytes[1] || z.Bytes[1] >= raw {
		t.Errorf("zstd %d bytes, recipes %d, raw %d", z.Bytes[1], rc.Bytes[1], raw)
	}
	md := rep.Markdown()
	for _, want := range []string{"| recipes |", "| zstd (default level) |", "| gzip (default level) |", "| raw |", "Goals of issue 14"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestSelectSortInMemory runs the comparison at a small scale. Run checks
// that every scheme's decoding reproduced both results exactly.
func TestSelectSortInMemory(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rows = 5000
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkStructure(t, rep, cfg.Rows)
}

// TestSelectSortPostgres runs it on a real table through pgx: the rows
// are cut from RawValues.
func TestSelectSortPostgres(t *testing.T) {
	pg := testenv.Postgres(t)
	url, err := pg.CreateDatabase(context.Background(), "selectsort")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Rows, cfg.PostgresURL, cfg.Load = 1000, url, true
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkStructure(t, rep, cfg.Rows)
	if !strings.Contains(rep.Source, "PostgreSQL") {
		t.Errorf("source %q", rep.Source)
	}
	t.Log("\n" + rep.Markdown())
}
