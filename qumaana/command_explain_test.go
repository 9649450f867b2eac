package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"
)

func TestExplainCommand(t *testing.T) {
	var out bytes.Buffer
	err := runExplain([]string{"--schema", "testdata/rubis/schema.sql", "SELECT * FROM items", "WHERE seller = $1 AND end_date >= now()"}, strings.NewReader(""), &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Cacheable    yes", "Clock-bound  yes", "end_date >= $2::timestamp", "public.items(seller)=$1  keyed on (seller)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	// From standard input, with the QUMA file's schema and sets, as JSON.
	out.Reset()
	err = runExplain([]string{"--quma", "testdata/rubis/quma.json", "--format", "json", "-"}, strings.NewReader("SELECT nickname FROM users WHERE id = $1\n"), &out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Template     string `json:"template"`
		Cacheable    bool   `json:"cacheable"`
		InQUMAFile   *bool  `json:"in_quma_file"`
		Dependencies []struct {
			Tags []string `json:"tags"`
		} `json:"dependencies"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if r.Template == "" || !r.Cacheable || r.InQUMAFile == nil || !*r.InQUMAFile || len(r.Dependencies) != 1 || r.Dependencies[0].Tags[0] != "public.users(id)=$1" {
		t.Errorf("JSON report %+v", r)
	}
}

// TestExplainUnreachableMetrics: the static part is printed, the endpoint
// is named with its error, and the command fails.
func TestExplainUnreachableMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out bytes.Buffer
	err = runExplain([]string{"--schema", "testdata/rubis/schema.sql", "--metrics", addr, "SELECT * FROM items WHERE id = $1"}, nil, &out)
	if err == nil || !strings.Contains(err.Error(), "1 of 1 metrics endpoints could not be read") {
		t.Errorf("err %v", err)
	}
	for _, want := range []string{"Cacheable    yes", "public.items(id)=$1", "http://" + addr + "/metrics", "not read: unreachable", "no endpoint could be read"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestExplainCommandBadInput(t *testing.T) {
	cases := []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"SELECT 1"}, "", "no schema"},
		{[]string{"--schema", "testdata/rubis/schema.sql", "--db", "postgres://x", "SELECT 1"}, "", "not both"},
		{[]string{"--schema", "testdata/rubis/schema.sql", "--format", "xml", "SELECT 1"}, "", "--format"},
		{[]string{"--schema", "no-such-file.sql", "SELECT 1"}, "", "no-such-file.sql"},
		{[]string{"--quma", "no-such-file.json", "SELECT 1"}, "", "no-such-file.json"},
		{[]string{"--quma", "testdata/rubis/schema.sql", "SELECT 1"}, "", "read QUMA file"},
		{[]string{"--schema", "testdata/rubis/schema.sql"}, "  \n", "no statement"},
		{[]string{"--schema", "testdata/rubis/schema.sql", "SELECT * FROM items WHERE id = = 1"}, "", "column 32: syntax error at or near \"=\"\n  SELECT * FROM items WHERE id = = 1\n                                 ^"},
		{[]string{"--schema", "testdata/rubis/schema.sql", "-"}, "SELECT *\nFROM items WHERE (", "line 2, column 19"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		err := runExplain(c.args, strings.NewReader(c.stdin), &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
		if out.Len() > 0 {
			t.Errorf("%v: printed a report on error:\n%s", c.args, out.String())
		}
	}
}
