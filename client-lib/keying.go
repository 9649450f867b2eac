package larder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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
	// have is the invalidator's answer the keying was made with (nil: none).
	have *invalidation.TagSetsReply
	// from holds the effective LSN of each set registered at run time, by
	// invalidation.SetName: a result keyed on it must be computed at or
	// after it.
	from   map[string]uint64
	mu     sync.Mutex
	byPath map[string]*quma.Analyzer // by search path
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

// publishedAt reports whether every keyed tag of qtags is of a set the
// invalidator published at ts: every change after ts travels on its
// subject. A set registered at run time is published from its effective
// LSN on; a result computed at an older snapshot must not be keyed on it.
func (k *keying) publishedAt(qtags []quma.QueryTag, ts uint64) bool {
	if len(k.from) == 0 {
		return true
	}
	for _, q := range qtags {
		if q.IsTable() {
			continue
		}
		if from, ok := k.from[invalidation.SetName(q.Table, q.Columns)]; ok && ts < from {
			return false
		}
	}
	return true
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

// loadKeying reads the live catalog and takes the invalidator's answer
// have (nil: it has not said) on which tables and tag column sets it
// publishes. The QUMA file's sets are used where the invalidator
// publishes them; the others are registered with it (unless
// Config.NoRegisterTagSets)
// and used once it publishes them. fileSchema is the schema the file was
// computed with (differences are logged: the live catalog is what counts).
func (c *Client) loadKeying(ctx context.Context, reply *invalidation.TagSetsReply) (*keying, error) {
	live, err := readCatalog(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	if c.fileSchema != nil {
		for _, d := range schemaDiff(c.fileSchema, live) {
			c.cfg.Log.Warn("larder: the QUMA file's schema differs from the database; the live catalog is used", "difference", d)
		}
	}
	k := &keying{schema: live, byPath: map[string]*quma.Analyzer{}}
	if reply == nil {
		c.cfg.Log.Warn("larder: the invalidator has not said which tables and tag column sets it publishes: nothing is cached until it does")
		return k, nil
	}
	have := reply.Tables
	k.covered = map[string]bool{}
	k.sets = map[string][][]string{}
	k.have, k.from = reply, reply.From
	for table := range have {
		k.covered[table] = true
	}
	missing := map[string][][]string{}
	for table, sets := range c.wantSets {
		for _, set := range sets {
			if containsSet(have[table], set) {
				k.sets[table] = append(k.sets[table], set)
			} else if k.covered[table] {
				missing[table] = append(missing[table], set)
			}
		}
	}
	if len(missing) > 0 {
		c.registerLater(missing)
	}
	return k, nil
}

// registerLater registers with the invalidator, in the background, the
// tag column sets the QUMA file keys on and the invalidator does not
// publish (once per set and client; a refused set is logged with the
// invalidator's reason and not asked for again). Until they are
// published, results that would key on them use the table tag.
func (c *Client) registerLater(missing map[string][][]string) {
	ask := map[string][][]string{}
	c.regMu.Lock()
	for table, sets := range missing {
		for _, set := range sets {
			name := invalidation.SetName(table, set)
			if c.registered[name] {
				continue
			}
			c.registered[name] = true
			ask[table] = append(ask[table], set)
		}
	}
	c.regMu.Unlock()
	if len(ask) == 0 {
		return
	}
	if c.cfg.NoRegisterTagSets {
		for table, sets := range ask {
			for _, set := range sets {
				c.cfg.Log.Warn("larder: the invalidator does not publish this tag column set, and registering it is off; results use the table tag instead", "set", invalidation.SetName(table, set))
			}
		}
		return
	}
	c.goBackground(func() { c.register(c.ctx, ask) })
}

// Registration attempts: each waits for the invalidator's answer at most
// registerTimeout; a failed one is tried again after registerBackoff,
// doubled each time up to registerMaxBackoff.
var (
	registerTimeout    = 35 * time.Second
	registerBackoff    = time.Second
	registerMaxBackoff = 30 * time.Second
)

// register asks the invalidator to publish sets and, when it does, reloads
// the keying with its answer. An attempt that fails (no answer in time,
// NATS down, the invalidator not replicating yet) is tried again, with a
// growing pause, until one is answered or the client closes; meanwhile
// results that would key on the sets use the table tag.
func (c *Client) register(ctx context.Context, sets map[string][][]string) {
	pause := registerBackoff
	for !c.registerOnce(ctx, sets) {
		select {
		case <-ctx.Done():
			// Closing: asked again by the next client.
			c.regMu.Lock()
			for table, ss := range sets {
				for _, set := range ss {
					delete(c.registered, invalidation.SetName(table, set))
				}
			}
			c.regMu.Unlock()
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, registerMaxBackoff)
	}
}

// registerOnce makes one registration attempt; false when it failed and
// is worth trying again.
func (c *Client) registerOnce(ctx context.Context, sets map[string][][]string) bool {
	b, _ := json.Marshal(&invalidation.TagSetsRegistration{Sets: sets})
	rctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	msg, err := c.nc.RequestWithContext(rctx, invalidation.TagSetsRegisterSubject(c.cfg.Prefix), b)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		c.m.registrations.WithLabelValues("failed").Inc()
		c.cfg.Log.Warn("larder: registering tag column sets with the invalidator failed; results use the table tag until it succeeds (trying again)", "err", err)
		return false
	}
	var out invalidation.TagSetsRegistered
	if err := json.Unmarshal(msg.Data, &out); err != nil || out.Error != "" {
		c.m.registrations.WithLabelValues("failed").Inc()
		c.cfg.Log.Warn("larder: the invalidator did not register the tag column sets; results use the table tag until it does (trying again)", "err", err, "reason", out.Error)
		return false
	}
	for name, why := range out.Refused {
		c.m.registrations.WithLabelValues("refused").Inc()
		c.cfg.Log.Warn("larder: the invalidator refused to publish a tag column set; results use the table tag instead", "set", name, "reason", why)
	}
	for _, w := range out.Warnings {
		c.cfg.Log.Info("larder: tag column set registration", "note", w)
	}
	c.m.registrations.WithLabelValues("registered").Add(float64(countSets(sets) - len(out.Refused)))
	c.cfg.Log.Info("larder: tag column sets registered with the invalidator", "sets", countSets(sets)-len(out.Refused), "effective_lsn", fmt.Sprintf("%X", out.Effective))
	if out.Reply != nil {
		if k := c.keying.Load(); k == nil || k.covered == nil || !sameTagSets(k.have, out.Reply) {
			c.reloadKeying(ctx, "tag column sets registered", out.Reply)
		}
	}
	return true
}

func countSets(m map[string][][]string) int {
	n := 0
	for _, sets := range m {
		n += len(sets)
	}
	return n
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
// answer. It does not wait when NATS is not connected or nobody answers
// the subject (the invalidator is not running).
func askTagSets(ctx context.Context, nc *nats.Conn, cfg Config, wait time.Duration) *invalidation.TagSetsReply {
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		if !nc.IsConnected() {
			return nil
		}
		actx, acancel := context.WithTimeout(rctx, 250*time.Millisecond)
		msg, err := nc.RequestWithContext(actx, invalidation.TagSetsSubject(cfg.Prefix), nil)
		acancel()
		if err == nil {
			reply, derr := invalidation.DecodeTagSetsReply(msg.Data)
			if derr == nil {
				return &reply
			}
			err = derr
		}
		if errors.Is(err, nats.ErrNoResponders) {
			return nil
		}
		cfg.Log.Debug("larder: asking the invalidator for its tables and tag column sets", "err", err)
		select {
		case <-rctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sameTagSets reports whether two answers of the invalidator name the
// same tables and, for each, the same tag column sets (in any order) with
// the same effective LSNs.
func sameTagSets(ra, rb *invalidation.TagSetsReply) bool {
	if ra == nil || rb == nil {
		return ra == rb
	}
	if !maps.Equal(ra.From, rb.From) {
		return false
	}
	return maps.EqualFunc(ra.Tables, rb.Tables, func(x, y [][]string) bool {
		if len(x) != len(y) {
			return false
		}
		for _, set := range x {
			if !containsSet(y, set) {
				return false
			}
		}
		return true
	})
}

func containsSet(sets [][]string, set []string) bool {
	for _, s := range sets {
		if slices.Equal(s, set) {
			return true
		}
	}
	return false
}

// refreshKeying reloads the catalog and asks the invalidator for its
// coverage again (a schema change); the sessions' scopes are read again
// before their next read-only transaction.
func (c *Client) refreshKeying(ctx context.Context, why string) {
	c.reloadKeying(ctx, why, askTagSets(ctx, c.nc, c.cfg, 5*time.Second))
}

// recheckTagSets asks the invalidator for its coverage and reloads when
// the answer differs from the one the keying was made with (it started,
// or restarted with other tag column sets). No answer keeps the keying.
func (c *Client) recheckTagSets(ctx context.Context, why string) {
	have := askTagSets(ctx, c.nc, c.cfg, time.Second)
	if have == nil {
		return
	}
	if k := c.keying.Load(); k.covered != nil && sameTagSets(k.have, have) {
		return
	}
	c.reloadKeying(ctx, why, have)
}

// reloadKeying reloads the catalog with the invalidator's answer have.
func (c *Client) reloadKeying(ctx context.Context, why string, have *invalidation.TagSetsReply) {
	k, err := c.loadKeying(ctx, have)
	if err != nil {
		if ctx.Err() != nil {
			return // closing
		}
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
