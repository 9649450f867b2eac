package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAnalyzeCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "quma.json")
	var stdout bytes.Buffer
	err := runAnalyze([]string{"--schema", "testdata/rubis/schema.sql", "--templates", "../bench/rubis/datagen/templates.sql", "--format", "json", "-o", out}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var sol struct {
		Version int `json:"version"`
		Queries []struct {
			ID        string `json:"id"`
			Cacheable bool   `json:"cacheable"`
		} `json:"queries"`
		Tables map[string]struct {
			TagColumns [][]string `json:"tag_columns"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(b, &sol); err != nil {
		t.Fatal(err)
	}
	if sol.Version != 1 || len(sol.Queries) < 20 || len(sol.Tables["public.items"].TagColumns) == 0 {
		t.Fatalf("solution: version %d, %d queries, items tag columns %v", sol.Version, len(sol.Queries), sol.Tables["public.items"].TagColumns)
	}

	stdout.Reset()
	if err := runAnalyze([]string{"--schema", "testdata/inventory/schema.sql", "--templates", "testdata/inventory/templates.sql"}, &stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Query templates", "public.inv(name)=$1", "Write templates", "Tag column sets"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestAnalyzeCommandBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.sql")
	if err := os.WriteFile(bad, []byte("SELECT * FROM inv WHERE id = ;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--templates", "x.sql"}, "exactly one of --schema"},
		{[]string{"--schema", "testdata/inventory/schema.sql"}, "give a workload"},
		{[]string{"--schema", "testdata/inventory/schema.sql", "--templates", "testdata/inventory/templates.sql", "--format", "xml"}, "--format"},
		{[]string{"--schema", "no-such-file.sql", "--templates", "testdata/inventory/templates.sql"}, "no-such-file.sql"},
		{[]string{"--schema", "testdata/inventory/schema.sql", "--templates", bad}, "syntax error"},
	}
	for _, c := range cases {
		err := runAnalyze(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
	}
}
