package main

import (
	"flag"
	"io"
	"testing"
)

// --mode-url names a direct-style mode on another PostgreSQL; it may move
// the baseline, not replace a Larder mode.
func TestModeURLFlag(t *testing.T) {
	urls := modeURLs{}
	fs := flag.NewFlagSet("rubis-bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(urls, "mode-url", "")
	err := fs.Parse([]string{"--mode-url", "pg16=postgres://u:secret@db.example:5432/rubis?sslmode=disable",
		"--mode-url", "direct=postgres://127.0.0.1:6432/postgres"})
	if err != nil {
		t.Fatal(err)
	}
	if len(urls) != 2 || urls["pg16"] != "postgres://u:secret@db.example:5432/rubis?sslmode=disable" {
		t.Fatalf("%v", urls)
	}
	b := &bench{urls: urls}
	if !b.direct("pg16") || !b.direct("direct") || b.direct("larder") {
		t.Error("direct-style modes")
	}
	if h := hostOf(urls["pg16"]); h != "db.example:5432/rubis" {
		t.Errorf("the report shows %q (no credentials)", h)
	}
	for _, bad := range []string{"pg16", "=postgres://x", "larder=postgres://x", "a b=postgres://x", "x=redis://y"} {
		if err := (modeURLs{}).Set(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
