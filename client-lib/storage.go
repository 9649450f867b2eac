package larder

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The storage check (see holdTables) compares, for each table a
// transaction reads, the storage (relfilenode) its snapshot's catalog
// names with the storage the table has once locked. Asked of the catalog
// for every transaction, it cost PostgreSQL about 270 µs of CPU (a
// catalog join, planned each time): four times a whole uncached
// transaction. storageFacts remembers what earlier checks proved, so
// that most transactions ask only for the tables' current storage.
//
// A fact (F, x) says: a snapshot at LSN x named storage F for the table,
// and F was the table's storage when that transaction held it. For a
// transaction at LSN p >= x that holds the table and finds its current
// storage still F, the storage its snapshot names is F as well: the
// table's storage is F at x and now, and a TRUNCATE or rewrite in between
// would have given it a new relfilenode (PostgreSQL never gives a table
// back a relfilenode it had, short of OID wraparound). Any other case
// (no fact, p < x, a different current storage, a partitioned table,
// whose partitions have the storage) runs the whole check, which then
// records a fact.
type storageFacts struct {
	mu sync.Mutex
	m  map[string]storageFact
}

type storageFact struct {
	filenode uint64
	at       uint64
}

// known returns the facts usable at ts for every table, or false.
func (s *storageFacts) known(tables []string, ts uint64) ([]storageFact, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	facts := make([]storageFact, len(tables))
	for i, name := range tables {
		f, ok := s.m[name]
		if !ok || f.at > ts {
			return nil, false
		}
		facts[i] = f
	}
	return facts, true
}

// learn records that a snapshot at ts named storage filenode for table,
// which was its storage then.
func (s *storageFacts) learn(table string, filenode, ts uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]storageFact{}
	}
	if f, ok := s.m[table]; ok && f.filenode == filenode && f.at <= ts {
		return // the older fact covers more
	}
	s.m[table] = storageFact{filenode: filenode, at: ts}
}

// holdPlan is how a transaction holds the tables it does not hold yet.
type holdPlan struct {
	tables []string // schema.table, not held yet
	list   string   // their quoted names, comma-separated
	lits   []string // their names as regclass literals
	nsps   []string // their schemas, as text literals
	names  []string // their names, as text literals
	facts  []storageFact
	// unplaced: the transaction's snapshot has no timestamp yet (a fresh
	// one being placed); the check learns nothing from it.
	unplaced bool
}

// beforeFullCheckForTest, when set, runs before the whole check that
// follows a quick check finding a table's storage moved.
var beforeFullCheckForTest func()

// errStorageMoved: the quick check found a table's storage is not the
// one an earlier check recorded; the whole check decides.
var errStorageMoved = errors.New("storage moved since the last check")

// planHold returns the plan for tables at ts (nil when all are held).
func (t *ROTx) planHold(tables []string, ts uint64) *holdPlan {
	p := &holdPlan{}
	var quoted []string
	for _, name := range tables {
		if t.held[name] {
			continue
		}
		if schema, rel, ok := strings.Cut(name, "."); ok {
			id := pgx.Identifier{schema, rel}.Sanitize()
			p.tables = append(p.tables, name)
			quoted = append(quoted, id)
			p.lits = append(p.lits, "'"+strings.ReplaceAll(id, "'", "''")+"'::regclass")
			p.nsps = append(p.nsps, textLiteral(schema))
			p.names = append(p.names, textLiteral(rel))
		}
	}
	if len(p.tables) == 0 {
		return nil
	}
	p.list = strings.Join(quoted, ", ")
	p.facts, _ = t.c.storage.known(p.tables, ts)
	return p
}

// sql is the lock and, when every table has a fact, the quick check (the
// tables' current storage), else the whole check.
func (p *holdPlan) sql() string { return strings.Join(p.statements(), "; ") }

// statements are sql's statements, one by one (a pipeline of
// extended-protocol statements takes one each).
func (p *holdPlan) statements() []string {
	lock := "LOCK TABLE " + p.list + " IN ACCESS SHARE MODE"
	if p.facts != nil {
		return []string{lock, p.currentSQL()}
	}
	return []string{lock, p.countSQL(), p.currentSQL()}
}

func (p *holdPlan) currentSQL() string {
	cols := make([]string, len(p.lits))
	for i, l := range p.lits {
		cols[i] = "pg_catalog.pg_relation_filenode(" + l + ")"
	}
	return "SELECT " + strings.Join(cols, ", ")
}

// fullSQL counts the tables (and partitions) whose storage is not the
// snapshot's, then reads the tables' current storage (to learn from).
//
// A table counts too when the snapshot knew its OID under another name:
// the statement names tables as the catalog does now, so after two
// tables swapped names an old snapshot would read the other one's rows.
func (p *holdPlan) fullSQL() string {
	return p.countSQL() + "; " + p.currentSQL()
}

// countSQL counts the tables whose storage is not the snapshot's (fullSQL).
func (p *holdPlan) countSQL() string {
	return "SELECT count(*) FROM unnest(ARRAY[" + strings.Join(p.lits, ", ") + "], ARRAY[" + strings.Join(p.nsps, ", ") + "]::text[], ARRAY[" +
		strings.Join(p.names, ", ") + "]::text[]) AS r(oid, nsp, rel) " +
		"CROSS JOIN LATERAL (SELECT r.oid AS relid UNION SELECT p.relid FROM pg_catalog.pg_partition_tree(r.oid) AS p) AS t " +
		"LEFT JOIN pg_catalog.pg_class c ON c.oid = t.relid " +
		"WHERE c.oid IS NULL OR coalesce(pg_catalog.pg_relation_filenode(c.oid), 0) <> c.relfilenode " +
		"OR (t.relid = r.oid AND (c.relname <> r.rel OR c.relnamespace <> (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = r.nsp)))"
}

// textLiteral quotes s as an SQL string literal.
func textLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// check reads the answer to sql (the last one or two of results).
func (p *holdPlan) check(c *Client, results []*pgconn.Result, ts uint64) error {
	if p.facts != nil {
		cur, err := p.current(results)
		if err != nil {
			return err
		}
		for i, f := range p.facts {
			if cur[i] != f.filenode {
				return errStorageMoved
			}
		}
		c.m.storageChecks.WithLabelValues("quick").Inc()
		return nil
	}
	if len(results) < 2 || len(results[len(results)-2].Rows) != 1 {
		return fmt.Errorf("larder: unexpected answer to the storage check of %s", p.list)
	}
	c.m.storageChecks.WithLabelValues("full").Inc()
	if string(results[len(results)-2].Rows[0][0]) != "0" {
		c.m.rewrittenRetries.Inc()
		return fmt.Errorf("larder: %s: %w", p.list, errRewritten)
	}
	cur, err := p.current(results)
	if err != nil {
		return err
	}
	for i, name := range p.tables {
		if cur[i] != 0 && !p.unplaced { // 0: no storage of its own (partitioned)
			c.storage.learn(name, cur[i], ts)
		}
	}
	return nil
}

// current parses the tables' current storage, the last of results
// (0 for a table without storage of its own).
func (p *holdPlan) current(results []*pgconn.Result) ([]uint64, error) {
	if len(results) == 0 || len(results[len(results)-1].Rows) != 1 || len(results[len(results)-1].Rows[0]) != len(p.tables) {
		return nil, fmt.Errorf("larder: unexpected answer to the storage check of %s", p.list)
	}
	row := results[len(results)-1].Rows[0]
	cur := make([]uint64, len(row))
	for i, v := range row {
		if v == nil {
			continue
		}
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("larder: storage check of %s: %w", p.list, err)
		}
		cur[i] = n
	}
	return cur, nil
}
