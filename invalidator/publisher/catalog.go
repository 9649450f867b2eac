package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ReadTagColumns reads the tag column sets from a QUMA solution file
// (qumaana's JSON): {"version": 1, "tables": {"public.inv": {"tag_columns":
// [["name"], ["id"]]}}}. Only the parts the invalidator needs are read.
func ReadTagColumns(r io.Reader) (map[string][][]string, error) {
	var f struct {
		Version int `json:"version"`
		Tables  map[string]struct {
			TagColumns [][]string `json:"tag_columns"`
		} `json:"tables"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("publisher: QUMA file: %w", err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("publisher: QUMA file: format version %d; this build reads 1", f.Version)
	}
	out := map[string][][]string{}
	for table, t := range f.Tables {
		if !strings.Contains(table, ".") {
			return nil, fmt.Errorf("publisher: QUMA file: table %q is not schema-qualified", table)
		}
		for _, set := range t.TagColumns {
			if len(set) == 0 {
				return nil, fmt.Errorf("publisher: QUMA file: table %s: an empty tag column set", table)
			}
		}
		out[table] = t.TagColumns
	}
	return out, nil
}

// ReadTagColumnsFile is ReadTagColumns on a file.
func ReadTagColumnsFile(path string) (map[string][][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	defer f.Close()
	return ReadTagColumns(f)
}

// tableInfo is what the catalogs say of a published table.
type tableInfo struct {
	oid      uint32
	name     string // schema.table
	quoted   string // for SQL
	identity byte   // relreplident: d, n, f, i
	idCols   []string
	keys     [][]string // primary key and unique indexes without expressions or predicates
	// keyIndexes are the OIDs of the indexes of keys: dropping one
	// changes the table's default tag sets.
	keyIndexes []uint32
	sets       [][]string // the tag column sets to publish
}

// loadTables reads every table of the publication.
func loadTables(ctx context.Context, conn *pgx.Conn, publication string) (map[string]*tableInfo, error) {
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname, c.relname, format('%I.%I', n.nspname, c.relname), c.relreplident::text,
  coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord)
     FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
     WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))),
   '{}')
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = $1`, publication)
	if err != nil {
		return nil, fmt.Errorf("publisher: read the publication's tables: %w", err)
	}
	tables := map[string]*tableInfo{}
	for rows.Next() {
		var oid uint32
		var schema, name, quoted, ident string
		var idCols []string
		if err := rows.Scan(&oid, &schema, &name, &quoted, &ident, &idCols); err != nil {
			rows.Close()
			return nil, fmt.Errorf("publisher: read the publication's tables: %w", err)
		}
		tables[schema+"."+name] = &tableInfo{oid: oid, name: schema + "." + name, quoted: quoted, identity: ident[0], idCols: idCols}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("publisher: read the publication's tables: %w", err)
	}
	keys, err := conn.Query(ctx, `
SELECT n.nspname || '.' || c.relname, i.indexrelid,
  array_agg(a.attname::text ORDER BY k.ord)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts
  AND (n.nspname, c.relname) IN (SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1)
GROUP BY i.indexrelid, n.nspname, c.relname, i.indisprimary
ORDER BY n.nspname, c.relname, i.indisprimary DESC, i.indexrelid`, publication)
	if err != nil {
		return nil, fmt.Errorf("publisher: read the tables' keys: %w", err)
	}
	for keys.Next() {
		var table string
		var index uint32
		var cols []string
		if err := keys.Scan(&table, &index, &cols); err != nil {
			keys.Close()
			return nil, fmt.Errorf("publisher: read the tables' keys: %w", err)
		}
		if t := tables[table]; t != nil {
			t.keys = append(t.keys, cols)
			t.keyIndexes = append(t.keyIndexes, index)
		}
	}
	if err := keys.Err(); err != nil {
		return nil, fmt.Errorf("publisher: read the tables' keys: %w", err)
	}
	return tables, nil
}

// chooseSets sets each table's tag column sets: the QUMA file's when it
// has the table, else its primary and unique keys.
func chooseSets(tables map[string]*tableInfo, fromQUMA map[string][][]string) {
	for name, t := range tables {
		if sets, ok := fromQUMA[name]; ok && fromQUMA != nil {
			t.sets = sets
		} else if fromQUMA == nil {
			t.sets = t.keys
		} else {
			t.sets = nil // the analysis found no keyed reads of this table
		}
	}
}

// IdentityError lists the tables whose replica identity cannot give the
// old values the invalidator needs, and the statements that fix them.
type IdentityError struct {
	Tables []string // schema-qualified
	Fixes  []string // one ALTER TABLE per table
	Why    []string
	// NoIdentity[i]: Tables[i] has no replica identity at all, and
	// PostgreSQL refuses its UPDATEs and DELETEs while it is published.
	NoIdentity []bool
}

func (e *IdentityError) Error() string {
	var b strings.Builder
	b.WriteString("invalidator: the replica identity of these tables cannot give the old values of their tag columns:\n")
	for _, w := range e.Why {
		b.WriteString("  " + w + "\n")
	}
	b.WriteString("run:\n")
	for _, f := range e.Fixes {
		b.WriteString("  " + f + "\n")
	}
	b.WriteString("or start the invalidator with --fix-replica-identity to run them")
	return b.String()
}

// checkIdentity finds the tables whose identity does not cover their tag
// columns, or that have no identity at all (PostgreSQL then refuses their
// UPDATEs and DELETEs once they are published).
func checkIdentity(tables map[string]*tableInfo) *IdentityError {
	var names []string
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	e := &IdentityError{}
	for _, n := range names {
		t := tables[n]
		why, none := "", false
		switch {
		case t.identity == 'f':
		case t.identity == 'n' || len(t.idCols) == 0:
			why, none = fmt.Sprintf("%s: no replica identity (UPDATE and DELETE would fail, old rows are unknown)", n), true
		default:
			have := map[string]bool{}
			for _, c := range t.idCols {
				have[c] = true
			}
			var missing []string
			for _, set := range t.sets {
				for _, c := range tableColumns(set) {
					if !have[c] && !contains(missing, c) {
						missing = append(missing, c)
					}
				}
			}
			if len(missing) > 0 {
				why = fmt.Sprintf("%s: tag columns %s are not in its replica identity (%s)", n, strings.Join(missing, ", "), strings.Join(t.idCols, ", "))
			}
		}
		if why != "" {
			e.Tables = append(e.Tables, n)
			e.Why = append(e.Why, why)
			e.NoIdentity = append(e.NoIdentity, none)
			e.Fixes = append(e.Fixes, fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;", t.quoted))
		}
	}
	if len(e.Tables) == 0 {
		return nil
	}
	return e
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// fixIdentity runs the fixes of e.
func fixIdentity(ctx context.Context, conn *pgx.Conn, e *IdentityError) error {
	var errs []error
	for _, f := range e.Fixes {
		if _, err := conn.Exec(ctx, f); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}
