package app

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

var tiny = datagen.Size{Users: 50, ActiveItems: 40, OldItems: 40, Categories: 5, Regions: 62, MaxDescription: 50, MaxComment: 50}

// loadTiny makes a database with a tiny RUBiS in it.
func loadTiny(t *testing.T) string {
	t.Helper()
	u := testenv.Database(t, env.PG)
	conn, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := datagen.Load(context.Background(), conn, datagen.Config{Size: tiny, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	return u
}

// visit is one page with its parameters and what it must show.
type visit struct {
	path   string
	params url.Values
	status int
	want   []string
}

func readVisits() []visit {
	auth := url.Values{"nickname": {"user3"}, "password": {"password3"}}
	with := func(v url.Values, kv ...string) url.Values {
		out := url.Values{}
		for k, vs := range v {
			out[k] = vs
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	return []visit{
		{"/Home", nil, 200, []string{"Welcome to RUBiS"}},
		{"/Register", nil, 200, nil},
		{"/Browse", nil, 200, nil},
		{"/BrowseCategories", nil, 200, []string{"category1", "category5"}},
		{"/BrowseRegions", nil, 200, []string{"region62"}},
		{"/BrowseCategoriesInRegion", url.Values{"region": {"3"}}, 200, []string{"category2"}},
		{"/SearchItemsInCategory", url.Values{"category": {"1"}}, 200, []string{"RUBiS automatically generated item"}},
		{"/SearchItemsInRegion", url.Values{"category": {"1"}, "region": {"4"}}, 200, nil},
		{"/ViewItem", url.Values{"itemId": {"1"}}, 200, []string{"item #1", "Highest bid", "Seller"}},
		{"/ViewItem", url.Values{"itemId": {"999999"}}, 404, nil},
		{"/ViewUserInfo", url.Values{"userId": {"3"}}, 200, []string{"user3"}},
		{"/ViewBidHistory", url.Values{"itemId": {"2"}}, 200, []string{"Bidders"}},
		{"/BuyNowAuth", nil, 200, nil},
		{"/BuyNow", with(auth, "itemId", "3"), 200, []string{"item #3"}},
		{"/BuyNow", url.Values{"nickname": {"user3"}, "password": {"wrong"}, "itemId": {"3"}}, 401, nil},
		{"/PutBidAuth", nil, 200, nil},
		{"/PutBid", with(auth, "itemId", "4"), 200, []string{"item #4", "Bids"}},
		{"/PutCommentAuth", nil, 200, nil},
		{"/PutComment", with(auth, "itemId", "5", "to", "6"), 200, []string{"user6"}},
		{"/Sell", nil, 200, nil},
		{"/SelectCategoryToSellItem", auth, 200, []string{"category3"}},
		{"/SellItemForm", nil, 200, nil},
		{"/AboutMeAuth", nil, 200, nil},
		{"/AboutMe", auth, 200, []string{"user3", "Current bids", "Won items", "Selling"}},
		{"/SearchItemsInCategory", url.Values{"category": {"x"}}, 400, nil},
	}
}

func get(t *testing.T, srv *httptest.Server, v visit) string {
	t.Helper()
	resp, err := http.Get(srv.URL + v.path + "?" + v.params.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != v.status {
		t.Fatalf("%s?%s: status %d, want %d: %s", v.path, v.params.Encode(), resp.StatusCode, v.status, body)
	}
	for _, w := range v.want {
		if !strings.Contains(string(body), w) {
			t.Errorf("%s?%s lacks %q", v.path, v.params.Encode(), w)
		}
	}
	return string(body)
}

func newServer(t *testing.T, db *sql.DB, cfg Config) *httptest.Server {
	t.Helper()
	cfg.DB = db
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func TestEveryInteractionDirect(t *testing.T) {
	db, err := sql.Open("pgx", loadTiny(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv := newServer(t, db, Config{})
	seen := map[string]bool{}
	for _, v := range readVisits() {
		get(t, srv, v)
		seen[strings.TrimPrefix(v.path, "/")] = true
	}
	// The writes, and what they change.
	post := func(path string, params url.Values, status int) {
		t.Helper()
		seen[strings.TrimPrefix(path, "/")] = true
		resp, err := http.PostForm(srv.URL+path, params)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Fatalf("%s: status %d, want %d: %s", path, resp.StatusCode, status, body)
		}
	}
	post("/RegisterUser", url.Values{"nickname": {"newbie"}, "password": {"pw"}, "email": {"n@x"}, "region": {"region5"}, "firstname": {"N"}, "lastname": {"B"}}, 200)
	post("/RegisterUser", url.Values{"nickname": {"newbie"}, "password": {"pw"}, "region": {"region5"}}, 409)
	post("/RegisterItem", url.Values{"userId": {"3"}, "categoryId": {"2"}, "initialPrice": {"10"}, "quantity": {"2"}, "duration": {"3"}, "name": {"a lamp"}}, 200)
	post("/StoreBid", url.Values{"userId": {"4"}, "itemId": {"41"}, "bid": {"12"}, "maxBid": {"15"}, "qty": {"1"}}, 200)
	post("/StoreBuyNow", url.Values{"userId": {"5"}, "itemId": {"41"}, "qty": {"2"}}, 200)
	post("/StoreBuyNow", url.Values{"userId": {"5"}, "itemId": {"41"}, "qty": {"1"}}, 409)
	post("/StoreComment", url.Values{"from": {"4"}, "to": {"3"}, "itemId": {"41"}, "rating": {"2"}, "comment": {"fine lamp"}}, 200)
	get(t, srv, visit{"/ViewItem", url.Values{"itemId": {"41"}}, 200, []string{"a lamp", "15.00"}})
	get(t, srv, visit{"/ViewUserInfo", url.Values{"userId": {"3"}}, 200, []string{"fine lamp"}})
	for _, name := range Interactions {
		if !seen[name] {
			t.Errorf("interaction %s was not exercised", name)
		}
	}
}

// The original now() form still works (uncacheable through Larder).
func TestSQLNowForm(t *testing.T) {
	db, err := sql.Open("pgx", loadTiny(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv := newServer(t, db, Config{UseSQLNow: true, NowGranularity: time.Second})
	get(t, srv, visit{"/SearchItemsInCategory", url.Values{"category": {"1"}}, 200, []string{"RUBiS automatically generated item"}})
}
