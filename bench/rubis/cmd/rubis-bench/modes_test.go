package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	larder "github.com/larderdb/larder/client-lib"
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

// TestWriteTemplates: a run's table holds what changed during the run,
// the templates with most PostgreSQL reads first, and none that was not
// read.
func TestWriteTemplates(t *testing.T) {
	before := []larder.TemplateFigures{
		{Template: "a", SQL: "SELECT a", Reads: map[string]int64{"l1": 5, "database": 5}, Misses: map[string]int64{"l1 compulsory": 5}},
		{Template: "idle", SQL: "SELECT idle", Reads: map[string]int64{"l1": 3}},
	}
	after := []larder.TemplateFigures{
		{Template: "a", SQL: "SELECT a", Reads: map[string]int64{"l1": 9, "database": 6, "patched": 2}, Misses: map[string]int64{"l1 compulsory": 5, "l1 staleness": 1}},
		{Template: "b", SQL: "SELECT b |\n  x", Reads: map[string]int64{"node": 1, "database": 3}, Misses: map[string]int64{"l1 compulsory": 4, "node compulsory": 3}},
		{Template: "idle", SQL: "SELECT idle", Reads: map[string]int64{"l1": 3}},
	}
	var w strings.Builder
	writeTemplates(&w, "repeat 1, local-only, 16 VUs", before, after)
	got := w.String()
	b := strings.Index(got, "| `SELECT b \\| x` | 4 | 0 / 1 | 3 / 0 / 0 | 4 / 0 / 0 / 0 | 3 / 0 / 0 / 0 |")
	a := strings.Index(got, "| `SELECT a` | 7 | 4 / 0 | 1 / 2 / 0 | 0 / 1 / 0 / 0 | 0 / 0 / 0 / 0 |")
	if a < 0 || b < 0 || b > a || strings.Contains(got, "idle") || !strings.Contains(got, "## repeat 1, local-only, 16 VUs") {
		t.Fatalf("table:\n%s", got)
	}
}

// The cached modes' cache warm-ups come before any measured run (their
// writes precede every mode's runs alike); then the modes take turns,
// each round starting one further on.
func TestScheduleWarmsCachesBeforeAnyMeasuredRun(t *testing.T) {
	direct, local, larder := variant{mode: "direct", label: "direct"}, variant{mode: "local-only", label: "local-only"}, variant{mode: "larder", label: "larder"}
	b := &bench{cacheWarmup: time.Minute}
	var got []string
	for _, st := range b.schedule([]variant{direct, local, larder}, 2) {
		if st.cacheWarmup {
			got = append(got, "warm "+st.vr.label)
		} else {
			got = append(got, fmt.Sprintf("%d %s", st.round, st.vr.label))
		}
	}
	want := "warm local-only, warm larder, 1 direct, 1 local-only, 1 larder, 2 local-only, 2 larder, 2 direct"
	if strings.Join(got, ", ") != want {
		t.Fatalf("schedule %q, want %q", strings.Join(got, ", "), want)
	}
	b.cacheWarmup = 0
	if steps := b.schedule([]variant{direct, local}, 1); len(steps) != 2 || steps[0].cacheWarmup || steps[1].cacheWarmup {
		t.Fatalf("no cache warm-up asked: %+v", steps)
	}
	// Each round starts one variant further on: over as many rounds as
	// variants, each runs first once and in every position once.
	variants := []variant{direct, local, larder}
	first := map[string]int{}
	position := map[string]map[int]bool{}
	var round int
	for i, st := range b.schedule(variants, len(variants)) {
		if st.round != round {
			round = st.round
			first[st.vr.label]++
		}
		if position[st.vr.label] == nil {
			position[st.vr.label] = map[int]bool{}
		}
		position[st.vr.label][i%len(variants)] = true
	}
	for _, vr := range variants {
		if first[vr.label] != 1 || len(position[vr.label]) != len(variants) {
			t.Fatalf("%s: first in %d rounds, in positions %v: want first once and every position", vr.label, first[vr.label], position[vr.label])
		}
	}
}

func TestParseMemTotal(t *testing.T) {
	n, err := parseMemTotal("MemTotal:       24591180 kB\nMemFree:         1000 kB\n")
	if err != nil || n != 24591180<<10 {
		t.Fatalf("%d, %v", n, err)
	}
	for _, bad := range []string{"", "MemFree: 1 kB\n", "MemTotal: lots kB\n", "MemTotal: 5 MB\n"} {
		if _, err := parseMemTotal(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
