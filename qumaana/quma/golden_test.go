package quma

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in ../testdata")

// TestGolden analyzes the RUBiS and inventory workloads and compares the
// text report and the JSON file with the golden files beside them.
func TestGolden(t *testing.T) {
	for _, app := range []string{"rubis", "inventory"} {
		t.Run(app, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", app)
			schema := mustDDL(t, mustFile(t, filepath.Join(dir, "schema.sql")))
			templates := filepath.Join(dir, "templates.sql")
			if app == "rubis" {
				// RUBiS's templates live with the benchmark that runs them.
				templates = filepath.Join("..", "..", "bench", "rubis", "datagen", "templates.sql")
			}
			work, err := ReadTemplates(strings.NewReader(mustFile(t, templates)), "templates.sql")
			if err != nil {
				t.Fatal(err)
			}
			sol, err := AnalyzeWorkload(schema, work)
			if err != nil {
				t.Fatal(err)
			}
			var text, js bytes.Buffer
			if err := sol.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if err := sol.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			compareGolden(t, filepath.Join(dir, "quma.txt"), text.Bytes())
			compareGolden(t, filepath.Join(dir, "quma.json"), js.Bytes())

			// The JSON file loads back into an analyzer that gives the same tags.
			back, err := ReadSolution(bytes.NewReader(js.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			an := back.Analyzer()
			for _, q := range sol.Queries {
				tpl, err := an.Prepare(q.SQL)
				if err != nil {
					t.Fatal(err)
				}
				got := queryTagEntries(tpl.Deps)
				if tagsKey(got) != tagsKey(q.Tags) {
					t.Errorf("%s: online tags %v, offline %v", q.SQL, got, q.Tags)
				}
			}
		})
	}
}

func tagsKey(ts []TagEntry) string {
	var b strings.Builder
	for _, t := range ts {
		b.WriteString(tagText(t))
		b.WriteByte(' ')
	}
	return b.String()
}

func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./qumaana/quma -run Golden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the analysis (run with -update after checking the change):\n--- got\n%s", path, got)
	}
}
