package k6

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// k6Binary finds k6 on PATH or in the Go bin directory; a missing one
// fails with the command that installs it.
func k6Binary(t *testing.T) string {
	if p, err := exec.LookPath("k6"); err == nil {
		return p
	}
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "k6")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("k6 is not installed: run `bash deploy/install-deps.sh` (go install go.k6.io/k6@v1.8.1)")
	return ""
}

// The script's walk, run by k6 against a server that counts the pages,
// reproduces the specification's stationary shares of the bidding mix.
func TestScriptReproducesTheBiddingMix(t *testing.T) {
	k6 := k6Binary(t)
	var mu sync.Mutex
	count := map[string]int{}
	total := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		count[strings.TrimPrefix(r.URL.Path, "/")]++
		total++
		mu.Unlock()
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k6, "run", "--quiet", "--no-summary", "--no-usage-report",
		"-e", "BASE_URL="+srv.URL, "-e", "MIX=bidding", "-e", "THINK=0", "-e", "VUS=4", "-e", "DURATION=8s", "rubis.js")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("k6: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if total < 5000 {
		t.Fatalf("only %d requests: too few to compare shares", total)
	}
	spec := map[string]float64{"ViewItem": 16.3, "SearchItemsInCategory": 16.9, "SearchItemsInRegion": 6.9, "PutBid": 7.2,
		"StoreBid": 5.3, "Browse": 7.6, "BrowseCategories": 5.4, "ViewUserInfo": 4.2, "AboutMe": 3.1}
	for page, want := range spec {
		got := 100 * float64(count[page]) / float64(total)
		if math.Abs(got-want) > 1.5 {
			t.Errorf("%s: %.1f%% of %d requests, the specification says %.1f%%", page, got, total, want)
		}
	}
	writes := 0
	for _, w := range []string{"RegisterUser", "StoreBuyNow", "StoreBid", "StoreComment", "RegisterItem"} {
		writes += count[w]
	}
	if got := 100 * float64(writes) / float64(total); math.Abs(got-9.2) > 1.5 {
		t.Errorf("writing pages: %.1f%% of requests, the specification says 9.2%%", got)
	}
	t.Logf("%d requests; writing pages %.1f%%; ViewItem %.1f%%, SearchItemsInCategory %.1f%%, StoreBid %.1f%%", total, 100*float64(writes)/float64(total),
		100*float64(count["ViewItem"])/float64(total), 100*float64(count["SearchItemsInCategory"])/float64(total), 100*float64(count["StoreBid"])/float64(total))
}

// RUBiS's own answers — an item or user not found (404), a nickname taken
// or an item sold out (409) — are not failed requests; a server error is.
func TestNotFoundAndConflictAreNotFailures(t *testing.T) {
	k6 := k6Binary(t)
	var mu sync.Mutex
	served := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		switch strings.TrimPrefix(r.URL.Path, "/") {
		case "ViewItem", "ViewUserInfo":
			status = http.StatusNotFound
		case "StoreBid", "RegisterUser":
			status = http.StatusConflict
		case "AboutMe":
			status = http.StatusInternalServerError
		}
		mu.Lock()
		served[status]++
		mu.Unlock()
		w.WriteHeader(status)
	}))
	defer srv.Close()
	summary := filepath.Join(t.TempDir(), "summary.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k6, "run", "--quiet", "--no-usage-report", "--summary-export", summary,
		"-e", "BASE_URL="+srv.URL, "-e", "MIX=bidding", "-e", "THINK=0", "-e", "VUS=2", "-e", "DURATION=3s", "rubis.js")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("k6: %v\n%s", err, out)
	}
	b, err := os.ReadFile(summary)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Metrics struct {
			Failed struct {
				Passes, Fails int
			} `json:"http_req_failed"`
		} `json:"metrics"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if served[http.StatusNotFound] == 0 || served[http.StatusConflict] == 0 || served[http.StatusInternalServerError] == 0 {
		t.Fatalf("served %v: every kind of answer is needed", served)
	}
	// http_req_failed's passes are the failed requests.
	if s.Metrics.Failed.Passes != served[http.StatusInternalServerError] {
		t.Errorf("%d failed requests, want the %d server errors only (served %v)", s.Metrics.Failed.Passes, served[http.StatusInternalServerError], served)
	}
}

// With several base URLs (application servers), virtual user k keeps to
// the ((k-1) mod n)-th: with as many users as servers, every server gets
// requests.
func TestSeveralBaseURLs(t *testing.T) {
	k6 := k6Binary(t)
	var mu sync.Mutex
	count := make([]int, 3)
	var bases []string
	for i := range count {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			count[i]++
			mu.Unlock()
		}))
		defer srv.Close()
		bases = append(bases, srv.URL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k6, "run", "--quiet", "--no-summary", "--no-usage-report",
		"-e", "BASE_URL="+strings.Join(bases, ","), "-e", "MIX=browsing", "-e", "THINK=0", "-e", "VUS=3", "-e", "DURATION=2s", "rubis.js")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("k6: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, n := range count {
		if n == 0 {
			t.Errorf("server %d got no request (requests per server: %v)", i, count)
		}
	}
}
