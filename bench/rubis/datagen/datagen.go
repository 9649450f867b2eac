package datagen

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed schema.sql
var schemaSQL string

//go:embed indexes.sql
var indexesSQL string

//go:embed templates.sql
var templatesSQL string

// TemplatesSQL is every statement of the specification as a template
// (qumaana's input for the application's tag column sets).
func TemplatesSQL() string { return templatesSQL }

// SchemaSQL is the RUBiS schema (without the secondary indexes).
func SchemaSQL() string { return schemaSQL }

// Size is how much data to generate.
type Size struct {
	Users, ActiveItems, OldItems int
	Categories, Regions          int
	// MaxText bounds descriptions and comments (the original: 8192 and
	// 2048 characters).
	MaxDescription, MaxComment int
}

// Original is the original RUBiS defaults.
var Original = Size{Users: 1_000_000, ActiveItems: 32_667, OldItems: 1_000_000, Categories: 20, Regions: 62, MaxDescription: 8192, MaxComment: 2048}

// TxCacheInMemory is the TxCache paper's "in-memory" configuration.
var TxCacheInMemory = Size{Users: 160_000, ActiveItems: 35_000, OldItems: 50_000, Categories: 20, Regions: 62, MaxDescription: 8192, MaxComment: 2048}

// Scaled returns s with users and items multiplied by f (at least one each).
func (s Size) Scaled(f float64) Size {
	scale := func(n int) int { return max(1, int(math.Round(float64(n)*f))) }
	s.Users, s.ActiveItems, s.OldItems = scale(s.Users), scale(s.ActiveItems), scale(s.OldItems)
	return s
}

// Config is one load.
type Config struct {
	Size Size
	Seed int64
	// Now anchors every date (default: the load time).
	Now time.Time
	// Progress, if not nil, receives a line per table.
	Progress io.Writer
}

// Counts are the rows loaded per table.
type Counts map[string]int64

// Load drops and creates the RUBiS tables on conn and fills them.
func Load(ctx context.Context, conn *pgx.Conn, cfg Config) (Counts, error) {
	s := cfg.Size
	if s.Users < 1 || s.ActiveItems < 0 || s.OldItems < 0 || s.Categories < 1 || s.Regions < 1 {
		return nil, errors.New("datagen: a size needs users, categories and regions")
	}
	if s.MaxDescription < 1 || s.MaxComment < 1 {
		return nil, errors.New("datagen: MaxDescription and MaxComment must be positive")
	}
	now := cfg.Now
	if now.IsZero() {
		now = time.Now()
	}
	now = now.UTC().Truncate(time.Second)
	g := &gen{r: rand.New(rand.NewSource(cfg.Seed)), s: s, now: now, out: cfg.Progress}
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		return nil, fmt.Errorf("datagen: schema: %w", err)
	}
	counts := Counts{}
	steps := []struct {
		table string
		cols  []string
		rows  func(yield func([]any) error) error
	}{
		{"categories", []string{"id", "name"}, g.categories},
		{"regions", []string{"id", "name"}, g.regions},
		{"users", []string{"id", "firstname", "lastname", "nickname", "password", "email", "rating", "balance", "creation_date", "region"}, g.users},
		{"items", itemCols, g.items(false)},
		{"old_items", itemCols, g.items(true)},
		{"bids", []string{"id", "user_id", "item_id", "qty", "bid", "max_bid", "date"}, g.bids},
		{"comments", []string{"id", "from_user_id", "to_user_id", "item_id", "rating", "date", "comment"}, g.comments},
	}
	for _, st := range steps {
		start := time.Now()
		n, err := copyRows(ctx, conn, st.table, st.cols, st.rows)
		if err != nil {
			return nil, fmt.Errorf("datagen: %s: %w", st.table, err)
		}
		counts[st.table] = n
		g.progress("%-10s %9d rows in %s", st.table, n, time.Since(start).Round(time.Millisecond))
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, indexesSQL); err != nil {
		return nil, fmt.Errorf("datagen: indexes: %w", err)
	}
	for _, t := range []string{"categories", "regions", "users", "items", "bids", "comments", "buy_now"} {
		if _, err := conn.Exec(ctx, fmt.Sprintf("SELECT setval(pg_get_serial_sequence('%s', 'id'), coalesce((SELECT max(id) FROM %s), 0) + 1, false)", t, t)); err != nil {
			return nil, fmt.Errorf("datagen: sequence of %s: %w", t, err)
		}
	}
	if _, err := conn.Exec(ctx, "ANALYZE"); err != nil {
		return nil, fmt.Errorf("datagen: analyze: %w", err)
	}
	counts["buy_now"] = 0
	g.progress("indexes and statistics in %s", time.Since(start).Round(time.Millisecond))
	return counts, nil
}

var itemCols = []string{"id", "name", "description", "initial_price", "quantity", "reserve_price", "buy_now", "nb_of_bids", "max_bid", "start_date", "end_date", "seller", "category"}

// copyRows streams rows into table with COPY.
func copyRows(ctx context.Context, conn *pgx.Conn, table string, cols []string, produce func(yield func([]any) error) error) (int64, error) {
	rows := make(chan []any, 1024)
	errc := make(chan error, 1)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(rows)
		errc <- produce(func(r []any) error {
			select {
			case rows <- r:
				return nil
			case <-pctx.Done():
				return pctx.Err()
			}
		})
	}()
	n, err := conn.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromFunc(func() ([]any, error) {
		r, ok := <-rows
		if !ok {
			return nil, nil
		}
		return r, nil
	}))
	cancel()
	for range rows { // let the producer finish
	}
	if perr := <-errc; err == nil && perr != nil && !errors.Is(perr, context.Canceled) {
		err = perr
	}
	return n, err
}

// gen produces the data, deterministically from its seed.
type gen struct {
	r   *rand.Rand
	s   Size
	now time.Time
	out io.Writer
	// per active item, for bids and comments
	itemSeller []int32
	itemPrice  []float32
	itemQty    []int32
	itemBids   []int8
	itemStart  []time.Time
}

func (g *gen) progress(format string, args ...any) {
	if g.out != nil {
		fmt.Fprintf(g.out, "rubis datagen: "+format+"\n", args...)
	}
}

func (g *gen) categories(yield func([]any) error) error {
	for i := 1; i <= g.s.Categories; i++ {
		if err := yield([]any{i, fmt.Sprintf("category%d", i)}); err != nil {
			return err
		}
	}
	return nil
}

func (g *gen) regions(yield func([]any) error) error {
	for i := 1; i <= g.s.Regions; i++ {
		if err := yield([]any{i, fmt.Sprintf("region%d", i)}); err != nil {
			return err
		}
	}
	return nil
}

func (g *gen) users(yield func([]any) error) error {
	for i := 1; i <= g.s.Users; i++ {
		created := g.now.Add(-time.Duration(g.r.Intn(3*365*24)) * time.Hour)
		row := []any{i, fmt.Sprintf("Great%d", i), fmt.Sprintf("User%d", i), fmt.Sprintf("user%d", i), fmt.Sprintf("password%d", i),
			fmt.Sprintf("user%d@rubis.example", i), 0, float32(0), created, 1 + i%g.s.Regions}
		if err := yield(row); err != nil {
			return err
		}
	}
	return nil
}

// items generates the active items (ending after now) or the old ones
// (ended in the last 60 days).
func (g *gen) items(old bool) func(yield func([]any) error) error {
	return func(yield func([]any) error) error {
		n := g.s.ActiveItems
		if old {
			n = g.s.OldItems
		} else {
			g.itemSeller = make([]int32, n)
			g.itemPrice = make([]float32, n)
			g.itemQty = make([]int32, n)
			g.itemBids = make([]int8, n)
			g.itemStart = make([]time.Time, n)
		}
		for i := 1; i <= n; i++ {
			duration := time.Duration(1+g.r.Intn(7)) * 24 * time.Hour
			var start time.Time
			if old {
				end := g.now.Add(-time.Duration(1+g.r.Intn(60*24*60)) * time.Minute)
				start = end.Add(-duration)
			} else {
				// Open now: started up to its duration ago.
				start = g.now.Add(-time.Duration(g.r.Int63n(int64(duration) - int64(time.Minute))))
			}
			end := start.Add(duration)
			initial := float32(1 + g.r.Intn(5000))
			reserve := initial + float32(g.r.Intn(1000))
			buyNow := reserve + float32(1+g.r.Intn(1000))
			qty := 1
			if g.r.Intn(5) == 0 {
				qty = 1 + g.r.Intn(10)
			}
			seller := 1 + g.r.Intn(g.s.Users)
			nbBids := g.r.Intn(20)
			maxBid := float32(0)
			if nbBids > 0 {
				maxBid = initial + float32(nbBids)
			}
			if !old {
				k := i - 1
				g.itemSeller[k], g.itemPrice[k], g.itemQty[k], g.itemBids[k], g.itemStart[k] = int32(seller), initial, int32(qty), int8(nbBids), start
			}
			row := []any{i, fmt.Sprintf("RUBiS automatically generated item #%d", i), g.text(g.s.MaxDescription), initial, qty, reserve, buyNow,
				nbBids, maxBid, start, end, seller, 1 + g.r.Intn(g.s.Categories)}
			// Old items keep their counters but not their bids, as in the
			// original generator.
			if err := yield(row); err != nil {
				return err
			}
		}
		return nil
	}
}

// bids gives each active item its bids: increasing from the initial
// price, the last one equal to the item's max_bid.
func (g *gen) bids(yield func([]any) error) error {
	id := 0
	for k := range g.itemBids {
		for b := 1; b <= int(g.itemBids[k]); b++ {
			id++
			bid := g.itemPrice[k] + float32(b)
			row := []any{id, 1 + g.r.Intn(g.s.Users), k + 1, 1 + g.r.Intn(int(g.itemQty[k])), bid, bid, g.itemStart[k].Add(time.Duration(b) * time.Minute)}
			if err := yield(row); err != nil {
				return err
			}
		}
	}
	return nil
}

// comments gives each active item one comment, from a random user to its
// seller.
func (g *gen) comments(yield func([]any) error) error {
	for k := range g.itemSeller {
		row := []any{k + 1, 1 + g.r.Intn(g.s.Users), int(g.itemSeller[k]), k + 1, g.r.Intn(11) - 5, g.itemStart[k], g.text(g.s.MaxComment)}
		if err := yield(row); err != nil {
			return err
		}
	}
	return nil
}

const words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua "

func (g *gen) text(maxLen int) string {
	n := 1 + g.r.Intn(maxLen)
	var b strings.Builder
	b.Grow(n)
	for b.Len() < n {
		off := g.r.Intn(len(words))
		b.WriteString(words[off:min(len(words), off+n-b.Len())])
	}
	return b.String()
}
