package larder

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/qumaana/quma"
)

// keying is what the client knows of the database's schema and of the
// invalidator's coverage, replaced whole when either changes.
type keying struct {
	schema *quma.Schema // the live catalog
	sets   map[string][][]string
	// covered holds the tables whose changes the invalidator publishes;
	// nil while it has not said (then nothing is cached).
	covered map[string]bool
	mu      sync.Mutex
	byPath  map[string]*quma.Analyzer // by search path
}

// analyzer returns the analyzer that resolves names along path (the
// session's current_schemas), as PostgreSQL does for that session.
func (k *keying) analyzer(path []string) *quma.Analyzer {
	p := strings.Join(path, "\x00")
	k.mu.Lock()
	defer k.mu.Unlock()
	if a := k.byPath[p]; a != nil {
		return a
	}
	s := *k.schema
	s.SearchPath = append([]string(nil), path...)
	if len(s.SearchPath) == 0 {
		s.SearchPath = []string{"public"}
	}
	a := quma.NewAnalyzer(&s, k.sets)
	if len(k.byPath) >= 64 {
		clear(k.byPath)
	}
	k.byPath[p] = a
	return a
}

// uncovered names a table of deps the invalidator does not publish, if any.
func (k *keying) uncovered(tables []string) (string, bool) {
	if k.covered == nil {
		return "the invalidator has not said which tables it covers", true
	}
	for _, t := range tables {
		if !k.covered[t] {
			return "table " + t + " is not covered by the invalidator", true
		}
	}
	return "", false
}

// coveredOf lists the tables of deps the invalidator covers (and that
// therefore exist in the catalog the client read).
func (k *keying) coveredOf(deps []quma.Dep) []string {
	var out []string
	for _, d := range deps {
		if k.covered[d.Table] && !slices.Contains(out, d.Table) {
			out = append(out, d.Table)
		}
	}
	return out
}

// loadKeying reads the live catalog and asks the invalidator which tables
// and tag column sets it publishes. want is the QUMA file's sets; fileSchema
// the schema the file was computed with (differences are logged: the live
// catalog is what counts).
func (c *Client) loadKeying(ctx context.Context, wait time.Duration) (*keying, error) {
	live, err := readCatalog(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	if c.fileSchema != nil {
		for _, d := range schemaDiff(c.fileSchema, live) {
			c.cfg.Log.Warn("larder: the QUMA file's schema differs from the database; the live catalog is used", "difference", d)
		}
	}
	have := askTagSets(ctx, c.nc, c.cfg, wait)
	k := &keying{schema: live, byPath: map[string]*quma.Analyzer{}}
	if have == nil {
		c.cfg.Log.Warn("larder: the invalidator did not say which tables and tag column sets it publishes: nothing is cached until it does")
		return k, nil
	}
	k.covered = map[string]bool{}
	k.sets = map[string][][]string{}
	for table := range have {
		k.covered[table] = true
	}
	for table, sets := range c.wantSets {
		for _, set := range sets {
			if containsSet(have[table], set) {
				k.sets[table] = append(k.sets[table], set)
			} else if k.covered[table] {
				c.cfg.Log.Warn("larder: the invalidator does not publish this tag column set; results use the table tag instead", "table", table, "columns", strings.Join(set, ","))
			}
		}
	}
	return k, nil
}

func readCatalog(ctx context.Context, pool *pgxpool.Pool) (*quma.Schema, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	defer conn.Release()
	s, err := quma.LoadCatalog(ctx, conn.Conn())
	if err != nil {
		return nil, fmt.Errorf("larder: read the schema: %w", err)
	}
	return s, nil
}

// schemaDiff lists the tables whose columns differ between two schemas.
func schemaDiff(file, live *quma.Schema) []string {
	var out []string
	for name, ft := range file.Tables {
		lt := live.Tables[name]
		if lt == nil {
			out = append(out, name+": not in the database")
			continue
		}
		if !slices.EqualFunc(ft.Columns, lt.Columns, func(a, b quma.Column) bool { return a.Name == b.Name && a.Type == b.Type }) {
			out = append(out, name+": columns differ")
		}
	}
	return out
}

// askTagSets asks the invalidator for the tables it covers and the tag
// column sets it publishes, retrying for up to wait; nil when it did not
// answer.
func askTagSets(ctx context.Context, nc *nats.Conn, cfg Config, wait time.Duration) map[string][][]string {
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(rctx, 250*time.Millisecond)
		msg, err := nc.RequestWithContext(actx, invalidation.TagSetsSubject(cfg.Prefix), nil)
		acancel()
		var have map[string][][]string
		if err == nil && json.Unmarshal(msg.Data, &have) == nil && have != nil {
			return have
		}
		cfg.Log.Debug("larder: asking the invalidator for its tables and tag column sets", "err", err)
		select {
		case <-rctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func containsSet(sets [][]string, set []string) bool {
	for _, s := range sets {
		if slices.Equal(s, set) {
			return true
		}
	}
	return false
}

// refreshKeying reloads the catalog and the invalidator's coverage; the
// sessions' scopes are read again before their next read-only transaction.
func (c *Client) refreshKeying(ctx context.Context, why string) {
	k, err := c.loadKeying(ctx, 5*time.Second)
	if err != nil {
		c.cfg.Log.Warn("larder: reloading the schema failed; nothing is cached until it succeeds", "why", why, "err", err)
		c.keying.Store(&keying{schema: quma.NewSchema(), byPath: map[string]*quma.Analyzer{}})
		c.epoch.Add(1)
		return
	}
	// A schema change may add custom settings policies, views or functions
	// read: the scope query is made again with the catalog.
	if sq, err := loadScopeQuery(ctx, c.pool); err == nil {
		c.scope.Store(sq)
	} else {
		c.cfg.Log.Warn("larder: listing the settings again failed; the earlier list is used", "why", why, "err", err)
	}
	if scope, err := c.readScope(ctx, c.pool); err == nil {
		c.poolScope.Store(&scope)
	}
	c.keying.Store(k)
	c.epoch.Add(1)
	c.m.schemaReloads.Inc()
	c.cfg.Log.Info("larder: schema and invalidator coverage reloaded", "why", why, "covered_tables", len(k.covered))
}

// schemaChangedSubject carries the invalidator's notices of schema changes.
func schemaChangedSubject(prefix string) string { return prefix + ".schema.changed" }
