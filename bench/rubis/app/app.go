package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	larder "github.com/larderdb/larder/client-lib"
)

// Config configures the application.
type Config struct {
	// DB is the database: the plain pgx driver ("direct") or the larder
	// driver; the code is the same.
	DB *sql.DB
	// ReadOnlyOptions are the options of the read-only transactions of
	// browsing pages (a context carrying the staleness limit, for larder).
	ReadContext func(context.Context) context.Context
	// NowGranularity rounds the $now parameter of time-dependent reads
	// (default 60 s), the rewrite that makes them cacheable.
	NowGranularity time.Duration
	// UseSQLNow runs the original end_date >= now() form instead.
	UseSQLNow bool
	// Functions builds the item, user and bid history pages in cacheable
	// functions (functions.go) rather than query by query.
	Functions bool
	// Clock is the time source (default time.Now).
	Clock func() time.Time
	// Log receives the errors of failed interactions (answered 500);
	// slog.Default() when nil.
	Log *slog.Logger
}

// App is the RUBiS web application.
type App struct {
	cfg Config
	mux *http.ServeMux
	// the cacheable functions of the item, user and bid history pages
	itemFn, userFn, bidsFn *larder.SQLFunction[int, []section]
}

// Interactions are the 27 emulator states, by path, in the order of the
// original transition tables' columns (package mix walks them).
var Interactions = []string{
	"Home", "Register", "RegisterUser", "Browse", "BrowseCategories", "SearchItemsInCategory",
	"BrowseRegions", "BrowseCategoriesInRegion", "SearchItemsInRegion", "ViewItem", "ViewUserInfo",
	"ViewBidHistory", "BuyNowAuth", "BuyNow", "StoreBuyNow", "PutBidAuth", "PutBid", "StoreBid",
	"PutCommentAuth", "PutComment", "StoreComment", "Sell", "SelectCategoryToSellItem", "SellItemForm",
	"RegisterItem", "AboutMeAuth", "AboutMe",
}

// New builds the application.
func New(cfg Config) (*App, error) {
	if cfg.DB == nil {
		return nil, errors.New("rubis: a database is required")
	}
	if cfg.NowGranularity <= 0 {
		cfg.NowGranularity = time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.ReadContext == nil {
		cfg.ReadContext = func(ctx context.Context) context.Context { return ctx }
	}
	a := &App{cfg: cfg, mux: http.NewServeMux()}
	a.itemFn = pageFunction("rubis-view-item", a.itemSections)
	a.userFn = pageFunction("rubis-view-user", a.userSections)
	a.bidsFn = pageFunction("rubis-view-bids", a.bidSections)
	handlers := map[string]func(*req) error{
		"Home": static("Welcome to RUBiS"), "Register": static("Register"), "Browse": static("Browse"),
		"BuyNowAuth": static("Buy now: log in"), "PutBidAuth": static("Bid: log in"), "PutCommentAuth": static("Comment: log in"),
		"Sell": static("Sell"), "SellItemForm": static("Sell an item"), "AboutMeAuth": static("About me: log in"),
		"RegisterUser": a.registerUser, "BrowseCategories": a.browseCategories, "SearchItemsInCategory": a.searchByCategory,
		"BrowseRegions": a.browseRegions, "BrowseCategoriesInRegion": a.browseCategories, "SearchItemsInRegion": a.searchByRegion,
		"ViewItem": a.viewItem, "ViewUserInfo": a.viewUserInfo, "ViewBidHistory": a.viewBidHistory, "BuyNow": a.buyNow,
		"StoreBuyNow": a.storeBuyNow, "PutBid": a.putBid, "StoreBid": a.storeBid, "PutComment": a.putComment,
		"StoreComment": a.storeComment, "SelectCategoryToSellItem": a.selectCategoryToSell, "RegisterItem": a.registerItem,
		"AboutMe": a.aboutMe,
	}
	for _, name := range Interactions {
		h := handlers[name]
		if h == nil {
			return nil, fmt.Errorf("rubis: no handler for %s", name)
		}
		a.mux.HandleFunc("/"+name, a.serve(name, h))
	}
	return a, nil
}

// Handler serves the application.
func (a *App) Handler() http.Handler { return a.mux }

// page is what an interaction renders: sections of rows.
type page struct {
	Title    string
	Message  string
	Sections []section
}

type section struct {
	Title   string
	Columns []string
	Rows    [][]string
}

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html><head><title>RUBiS: {{.Title}}</title></head><body>
<h1>{{.Title}}</h1>{{if .Message}}<p class="message">{{.Message}}</p>{{end}}
{{range .Sections}}<h2>{{.Title}}</h2><table><tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}</body></html>
`))

// req is one request being served.
type req struct {
	r    *http.Request
	ctx  context.Context
	page page
	// status is the HTTP status: 200, or 404 for "not found" pages, 400
	// for bad parameters.
	status int
}

func (q *req) intParam(name string) (int, error) {
	v := q.r.FormValue(name)
	n, err := strconv.Atoi(v)
	if err != nil {
		q.status = http.StatusBadRequest
		return 0, fmt.Errorf("parameter %s=%q is not a number", name, v)
	}
	return n, nil
}

func (q *req) floatParam(name string) (float64, error) {
	v := q.r.FormValue(name)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		q.status = http.StatusBadRequest
		return 0, fmt.Errorf("parameter %s=%q is not a number", name, v)
	}
	return f, nil
}

func (a *App) serve(name string, h func(*req) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := &req{r: r, ctx: r.Context(), page: page{Title: name}, status: http.StatusOK}
		if err := h(q); err != nil {
			if q.status == http.StatusOK {
				q.status = http.StatusInternalServerError
			}
			if q.status >= http.StatusInternalServerError {
				log := a.cfg.Log
				if log == nil {
					log = slog.Default()
				}
				log.Error("interaction failed", "interaction", name, "err", err)
			}
			http.Error(w, name+": "+err.Error(), q.status)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(q.status)
		_ = pageTemplate.Execute(w, q.page)
	}
}

func static(message string) func(*req) error {
	return func(q *req) error { q.page.Message = message; return nil }
}

// now is the $now parameter: the clock rounded down to the granularity.
func (a *App) now() time.Time {
	return a.cfg.Clock().UTC().Truncate(a.cfg.NowGranularity)
}

// endDateFilter renders "end_date >= $n" or the original now() form.
func (a *App) endDateFilter(col string, n int, args *[]any) string {
	if a.cfg.UseSQLNow {
		return col + " >= now()"
	}
	*args = append(*args, a.now())
	return fmt.Sprintf("%s >= $%d", col, n)
}

// read runs f in a read-only transaction. Larder may ask for a
// transaction to be run again (larder.ErrRetry: the snapshots its cached
// reads agreed on were released before it needed PostgreSQL); f starts
// over, a few times at most, as an application would.
func (a *App) read(q *req, f func(tx *sql.Tx) error) error {
	const attempts = 3
	sections, message := len(q.page.Sections), q.page.Message
	for i := 1; ; i++ {
		err := a.readOnce(q, f)
		if i == attempts || !errors.Is(err, larder.ErrRetry) {
			return err
		}
		// The attempt's output is dropped.
		q.page.Sections, q.page.Message = q.page.Sections[:sections], message
	}
}

func (a *App) readOnce(q *req, f func(tx *sql.Tx) error) error {
	tx, err := a.cfg.DB.BeginTx(a.cfg.ReadContext(q.ctx), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	err = f(tx)
	if cerr := tx.Commit(); err == nil {
		err = cerr
	}
	return err
}

// write runs f in a read/write transaction.
func (a *App) write(q *req, f func(tx *sql.Tx) error) error {
	tx, err := a.cfg.DB.BeginTx(q.ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// query appends a section with the rows of a query.
func query(q *req, tx *sql.Tx, title, sqlText string, args ...any) (section, error) {
	rows, err := tx.QueryContext(q.ctx, sqlText, args...)
	if err != nil {
		return section{}, fmt.Errorf("%s: %w", title, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return section{}, err
	}
	s := section{Title: title, Columns: cols}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return section{}, err
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = render(v)
		}
		s.Rows = append(s.Rows, row)
	}
	return s, rows.Err()
}

func render(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format("2006-01-02 15:04:05")
	case float32:
		return strconv.FormatFloat(float64(x), 'f', 2, 32)
	case float64:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return fmt.Sprint(v)
}

func (q *req) add(s section, err error) error {
	if err != nil {
		return err
	}
	q.page.Sections = append(q.page.Sections, s)
	return nil
}

// column returns the values of a column of a section.
func column(s section, name string) []string {
	for i, c := range s.Columns {
		if c == name {
			out := make([]string, len(s.Rows))
			for j, r := range s.Rows {
				out[j] = r[i]
			}
			return out
		}
	}
	return nil
}

// auth returns the user id for nickname and password, or an error page.
func (a *App) auth(q *req, tx *sql.Tx) (int, error) {
	var id int
	err := tx.QueryRowContext(q.ctx, "SELECT id FROM users WHERE nickname = $1 AND password = $2", q.r.FormValue("nickname"), q.r.FormValue("password")).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		q.status = http.StatusUnauthorized
		return 0, errors.New("unknown nickname or wrong password")
	}
	return id, err
}

func notFound(q *req, what string) error {
	q.status = http.StatusNotFound
	return fmt.Errorf("%s not found", what)
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return strings.TrimSpace(s)
}
