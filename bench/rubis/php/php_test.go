package php

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/larderdb/larder/bench/rubis/app"
	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/internal/testenv"
)

// visit is one request: a GET, or a POST of a form.
type visit struct {
	path   string
	params url.Values
	post   bool
	status int
}

func (v visit) String() string {
	m := "GET"
	if v.post {
		m = "POST"
	}
	return m + " " + v.path + "?" + v.params.Encode()
}

// page is an answer as the comparison sees it.
type page struct {
	status      int
	contentType string
	body        string
}

func fetch(t *testing.T, base string, v visit) page {
	t.Helper()
	var resp *http.Response
	var err error
	if v.post {
		resp, err = http.PostForm(base+v.path, v.params)
	} else {
		resp, err = http.Get(base + v.path + "?" + v.params.Encode())
	}
	if err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", v, err)
	}
	p := page{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(body)}
	if v.status != 0 && p.status != v.status {
		t.Fatalf("%s: status %d, want %d: %s", v, p.status, v.status, body)
	}
	return p
}

// same fetches v from the Go application and from the PHP one and fails
// on any difference of status, content type or body.
func same(t *testing.T, goURL, phpURL string, v visit) page {
	t.Helper()
	want, got := fetch(t, goURL, v), fetch(t, phpURL, v)
	if want != got {
		t.Fatalf("%s differs:\nGo:  %d %s\nPHP: %d %s\n%s\n--- PHP's page:\n%s", v, want.status, want.contentType, got.status, got.contentType,
			diffHint(want.body, got.body), got.body)
	}
	return got
}

func diffHint(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d:\n  Go:  %s\n  PHP: %s", i+1, la[i], lb[i])
		}
	}
	return fmt.Sprintf("lengths differ: %d and %d lines", len(la), len(lb))
}

// readVisits are every read-only page, found and not, and the error pages
// of bad parameters, over the tiny data set.
func readVisits() []visit {
	auth := func(user int, kv ...string) url.Values {
		v := url.Values{"nickname": {"user" + strconv.Itoa(user)}, "password": {"password" + strconv.Itoa(user)}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	var vs []visit
	for _, name := range []string{"Home", "Register", "Browse", "BuyNowAuth", "PutBidAuth", "PutCommentAuth", "Sell", "SellItemForm", "AboutMeAuth",
		"BrowseCategories", "BrowseRegions"} {
		vs = append(vs, visit{path: "/" + name})
	}
	vs = append(vs, visit{path: "/BrowseCategoriesInRegion", params: q("region", "3")})
	for c := 1; c <= tiny.Categories+1; c++ {
		vs = append(vs, visit{path: "/SearchItemsInCategory", params: q("category", strconv.Itoa(c))},
			visit{path: "/SearchItemsInCategory", params: q("category", strconv.Itoa(c), "page", "1")})
		for _, r := range []int{1, 4, 7, 11, 30} {
			vs = append(vs, visit{path: "/SearchItemsInRegion", params: q("category", strconv.Itoa(c), "region", strconv.Itoa(r), "page", "0")})
		}
	}
	for i := 1; i <= tiny.ActiveItems+tiny.OldItems+2; i += 1 + i%3 {
		id := strconv.Itoa(i)
		vs = append(vs, visit{path: "/ViewItem", params: q("itemId", id)}, visit{path: "/ViewBidHistory", params: q("itemId", id)})
	}
	for u := 1; u <= tiny.Users+1; u += 2 {
		vs = append(vs, visit{path: "/ViewUserInfo", params: q("userId", strconv.Itoa(u))})
	}
	for u := 1; u <= 12; u++ {
		vs = append(vs, visit{path: "/AboutMe", params: auth(u)}, visit{path: "/SelectCategoryToSellItem", params: auth(u)})
	}
	for i := 1; i <= tiny.ActiveItems+1; i += 3 {
		id := strconv.Itoa(i)
		vs = append(vs, visit{path: "/BuyNow", params: auth(i%tiny.Users+1, "itemId", id)},
			visit{path: "/PutBid", params: auth(i%tiny.Users+1, "itemId", id)},
			visit{path: "/PutComment", params: auth(3, "itemId", id, "to", strconv.Itoa(i%tiny.Users+1))})
	}
	return append(vs,
		// Errors: not found, not logged in, bad parameters, no such page.
		visit{path: "/ViewItem", params: q("itemId", "999999"), status: 404},
		visit{path: "/ViewUserInfo", params: q("userId", "999999"), status: 404},
		visit{path: "/BuyNow", params: url.Values{"nickname": {"user3"}, "password": {"wrong"}, "itemId": {"3"}}, status: 401},
		visit{path: "/BuyNow", params: auth(3, "itemId", "999999"), status: 404},
		visit{path: "/AboutMe", params: q("nickname", "nobody"), status: 401},
		visit{path: "/SearchItemsInCategory", params: q("category", "x"), status: 400},
		visit{path: "/SearchItemsInRegion", params: q("category", "1"), status: 400},
		visit{path: "/ViewItem", params: q("itemId", `"quoted" \ é`), status: 400},
		visit{path: "/ViewItem", status: 400},
		visit{path: "/PutComment", params: auth(3, "itemId", "2", "to", "+7e"), status: 400},
		visit{path: "/NoSuchPage", status: 404},
		visit{path: "/", status: 404},
		visit{path: "/Home/", status: 404},
	)
}

// goApp serves the Go application directly on PostgreSQL with a fixed
// clock.
func goApp(t *testing.T, pgURL string, now time.Time) string {
	t.Helper()
	db, err := sql.Open("pgx", pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a, err := app.New(app.Config{DB: db, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// phpApp serves the PHP application.
func phpApp(t *testing.T, cfg Config) string {
	t.Helper()
	requirePHP(t)
	log := &syncBuffer{}
	cfg.Log = log
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if log.Len() > 0 {
			t.Logf("PHP's log:\n%s", log.String())
		}
	})
	return s.URL()
}

// PHP on PostgreSQL (php-direct) renders every page as the Go application
// does; its writes answer as the Go application's and change the same.
func TestPagesDirect(t *testing.T) {
	pgURL := loadTiny(t)
	now := time.Now()
	goURL := goApp(t, pgURL, now)
	phpURL := phpApp(t, Config{DSN: pgURL, Direct: true, Workers: 2, Clock: now})
	for _, v := range readVisits() {
		same(t, goURL, phpURL, v)
	}
	writeVisits(t, pgURL, goURL, phpURL)
}

// PHP through the front (php-larder) renders every page as the Go
// application on PostgreSQL does, when its reads miss and when they hit;
// its writes, relayed to PostgreSQL, are seen by its session's next pages.
func TestPagesThroughFront(t *testing.T) {
	pgURL := loadTiny(t)
	st := startLarder(t, pgURL, datagen.SchemaSQL(), datagen.TemplatesSQL(), 0)
	now := time.Now()
	goURL := goApp(t, pgURL, now)
	phpURL := phpApp(t, Config{DSN: st.frontURL, Workers: 2, Clock: now})
	visits := readVisits()
	for round := 0; round < 2; round++ {
		hits := st.front.Stats().Hits.Load()
		for _, v := range visits {
			same(t, goURL, phpURL, v)
		}
		served, hits := st.front.Stats().Served.Load(), st.front.Stats().Hits.Load()-hits
		t.Logf("round %d: %d statements answered by the front, %d hits in this round", round, served, hits)
		if round == 1 && hits == 0 {
			t.Fatal("the second round had no cache hit: the pages did not go through Larder")
		}
	}
	if st.front.Stats().Transactions.Load() == 0 {
		t.Fatal("no Larder transaction: the front relayed everything")
	}
	// One worker, one session: the writes' effects are read back at once
	// (read your writes), so even cached pages equal PostgreSQL's.
	phpOne := phpApp(t, Config{DSN: st.frontURL, Workers: 1, Clock: now})
	writeVisits(t, pgURL, goURL, phpOne)
}

// writeVisits runs the writes through both applications on one database
// and compares what they answer, then the pages that show their effects.
func writeVisits(t *testing.T, pgURL, goURL, phpURL string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	post := func(base string, path string, status int, kv ...string) page {
		t.Helper()
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return fetch(t, base, visit{path: path, params: v, post: true, status: status})
	}
	both := func(path string, status int, kv ...string) {
		t.Helper()
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		same(t, goURL, phpURL, visit{path: path, params: v, post: true, status: status})
	}
	user := []string{"password", "pw", "email", "n@x", "region", "region5", "firstname", "N", "lastname", "B"}
	// RegisterUser: each its own user; the same answer for a taken
	// nickname, a missing one and an unknown region.
	p := post(phpURL, "/RegisterUser", 200, append([]string{"nickname", "phpuser"}, user...)...)
	if !strings.Contains(p.body, "<td>phpuser</td>") || !strings.Contains(p.body, "<td>n@x</td>") {
		t.Fatalf("RegisterUser's page lacks the user:\n%s", p.body)
	}
	post(goURL, "/RegisterUser", 200, append([]string{"nickname", "gouser"}, user...)...)
	both("/RegisterUser", 409, append([]string{"nickname", "phpuser"}, user...)...)
	both("/RegisterUser", 409, append([]string{"nickname", "  gouser  "}, user...)...)
	both("/RegisterUser", 400, "nickname", "   ")
	both("/RegisterUser", 404, "nickname", "someone", "region", "nowhere")
	var phpUser, goUser int
	if err := conn.QueryRow(ctx, "SELECT (SELECT id FROM users WHERE nickname = 'phpuser'), (SELECT id FROM users WHERE nickname = 'gouser')").Scan(&phpUser, &goUser); err != nil {
		t.Fatal(err)
	}

	// RegisterItem, StoreBid, StoreBuyNow, StoreComment: the same pages.
	item := func(name string) []string {
		return []string{"userId", "3", "categoryId", "2", "initialPrice", "10.5", "quantity", "2", "duration", "3", "name", name,
			"description", "a fine <thing> & more", "reservePrice", "12", "buyNow", "x"}
	}
	both("/RegisterItem", 200, item("php lamp")...)
	both("/RegisterItem", 400, "userId", "3", "categoryId", "2", "initialPrice", "cheap", "quantity", "1", "duration", "3")
	var lampA, lampB int
	if err := conn.QueryRow(ctx, "SELECT min(id), max(id) FROM items WHERE name = 'php lamp'").Scan(&lampA, &lampB); err != nil {
		t.Fatal(err)
	}
	if lampA == lampB {
		t.Fatalf("RegisterItem: one item %d, want two", lampA)
	}
	a, b := strconv.Itoa(lampA), strconv.Itoa(lampB)
	both("/StoreBid", 200, "userId", "4", "itemId", a, "bid", "12", "maxBid", "15.25", "qty", "1")
	both("/StoreBid", 200, "userId", "5", "itemId", b, "bid", "13", "maxBid", "14", "qty", "1")
	both("/StoreBid", 400, "userId", "5", "itemId", b, "bid", "abc", "maxBid", "14", "qty", "1")
	both("/StoreBid", 404, "userId", "5", "itemId", "999999", "bid", "1", "maxBid", "1", "qty", "1")
	both("/StoreBuyNow", 200, "userId", strconv.Itoa(phpUser), "itemId", a, "qty", "1")
	both("/StoreBuyNow", 409, "userId", strconv.Itoa(goUser), "itemId", a, "qty", "1") // both bought one: none left
	both("/StoreBuyNow", 409, "userId", "5", "itemId", b, "qty", "3")
	both("/StoreBuyNow", 404, "userId", "5", "itemId", "999999", "qty", "1")
	both("/StoreComment", 200, "from", "4", "to", "3", "itemId", a, "rating", "2", "comment", "fine lamp")
	both("/StoreComment", 404, "from", "4", "to", "999999", "itemId", a, "rating", "2", "comment", "x")

	// What the writes changed, read back.
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	for _, v := range []visit{
		{path: "/ViewItem", params: q("itemId", a)}, {path: "/ViewItem", params: q("itemId", b)},
		{path: "/ViewBidHistory", params: q("itemId", a)}, {path: "/ViewBidHistory", params: q("itemId", b)},
		{path: "/ViewUserInfo", params: q("userId", "3")}, {path: "/ViewUserInfo", params: q("userId", strconv.Itoa(phpUser))},
		{path: "/AboutMe", params: q("nickname", "phpuser", "password", "pw")}, {path: "/AboutMe", params: q("nickname", "user3", "password", "password3")},
		{path: "/AboutMe", params: q("nickname", "user4", "password", "password4")},
		{path: "/SearchItemsInCategory", params: q("category", "2")},
	} {
		p := same(t, goURL, phpURL, v)
		if v.path == "/ViewItem" && v.params.Get("itemId") == a && !strings.Contains(p.body, "<td>15.25</td>") {
			t.Fatalf("the bid is not on the item's page:\n%s", p.body)
		}
	}
}

// The library's PHPUnit suite (client-lib/php/tests), against PostgreSQL
// and against a front over it; the front's answers came from its cache.
func TestPHPUnit(t *testing.T) {
	phpunit := requirePHPUnit(t)
	pgURL := testenv.Database(t, env.PG)
	lib, err := filepath.Abs("../../../client-lib/php")
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := os.ReadFile(filepath.Join(lib, "tests", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, string(ddl))
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := startLarder(t, pgURL, string(ddl), "SELECT owner, balance FROM accounts WHERE id = $1;\nSELECT balance FROM accounts WHERE id = $1;\nSELECT owner FROM accounts WHERE id = $1;\n", 0)
	cmd := exec.Command(phpunit, "--do-not-cache-result")
	cmd.Dir = lib
	cmd.Env = append(os.Environ(), "LARDER_TEST_PG="+pgURL, "LARDER_TEST_FRONT="+st.frontURL)
	out, err := cmd.CombinedOutput()
	t.Logf("phpunit:\n%s", out)
	if err != nil {
		t.Fatalf("phpunit: %v", err)
	}
	if st.front.Stats().Hits.Load() == 0 {
		t.Fatal("the front answered no read from its cache")
	}
}

// syncBuffer collects PHP's log while its reader writes it.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// BenchmarkReadOnlyTransaction times, in one PHP process, a readOnly
// transaction of the item page's four reads on PostgreSQL and through a
// front (hits from its L1), with the persistent connection kept (reconnect
// 0) or taken again with pg_pconnect before each transaction, as each
// request of a PHP server does (reconnect 1: PHP sends RESET ALL).
//
//	go test -run '^$' -bench ReadOnlyTransaction -benchtime 2000x ./bench/rubis/php
func BenchmarkReadOnlyTransaction(b *testing.B) {
	php := requirePHP(b)
	pgURL := loadTiny(b)
	st := startLarder(b, pgURL, datagen.SchemaSQL(), datagen.TemplatesSQL(), 64<<20)
	for _, target := range []struct{ name, dsn, direct string }{{"postgres", pgURL, "1"}, {"front", st.frontURL, "0"}} {
		for _, reconnect := range []string{"0", "1"} {
			b.Run(target.name+"/reconnect="+reconnect, func(b *testing.B) {
				out, err := exec.Command(php, "testdata/transactions.php", target.dsn, target.direct, reconnect, strconv.Itoa(b.N)).CombinedOutput()
				if err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				us, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
				if err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				b.ReportMetric(us, "µs/tx")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
