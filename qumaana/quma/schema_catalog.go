package quma

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// catalogNamespaces keeps user schemas: not the system ones, not TOAST
// schemas, and of the temporary schemas only this session's, since other
// sessions' temporary tables are invisible to its queries.
const catalogNamespaces = `n.nspname NOT IN ('pg_catalog', 'information_schema')
	AND n.nspname !~ '^pg_toast'
	AND (n.nspname !~ '^pg_temp_' OR n.oid = pg_catalog.pg_my_temp_schema())`

// LoadCatalog reads the schema of conn's database from pg_catalog: tables
// (ordinary and partitioned) with their columns, keys and replica identity,
// views and materialized views, and the volatility of user functions. The
// result agrees with LoadDDL on the same DDL.
//
// Outside a transaction the reads run in one read-only repeatable-read
// transaction, so that concurrent DDL cannot make them disagree; inside one
// they run in the caller's.
func LoadCatalog(ctx context.Context, conn *pgx.Conn) (*Schema, error) {
	if conn.PgConn().TxStatus() == 'I' {
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, fmt.Errorf("quma: catalog: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }() // read only: nothing to commit
	}
	s := NewSchema()
	var path []string
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.current_schemas(false)::text[]`).Scan(&path); err != nil {
		return nil, fmt.Errorf("quma: catalog: search path: %w", err)
	}
	if len(path) > 0 {
		s.SearchPath = path
	}
	tables, err := catalogTables(ctx, conn, s)
	if err != nil {
		return nil, err
	}
	if err := catalogColumns(ctx, conn, tables); err != nil {
		return nil, err
	}
	if err := catalogKeys(ctx, conn, tables); err != nil {
		return nil, err
	}
	if err := catalogViews(ctx, conn, s); err != nil {
		return nil, err
	}
	if err := catalogFunctions(ctx, conn, s); err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// catalogTable is a table being loaded, with what its keys' query needs.
type catalogTable struct {
	t     *Table
	ident string // relreplident
}

// catalogTempName names this session's temporary relations after the first
// schema of the search path, as LoadDDL does: the analyzer resolves
// unqualified names through the search path, and PostgreSQL resolves them to
// a temporary relation first, so it shadows a namesake there.
func catalogTempName(s *Schema, relname string) string {
	if len(s.SearchPath) > 0 {
		return s.SearchPath[0] + "." + relname
	}
	return ddlDefaultSchema + "." + relname
}

func catalogTables(ctx context.Context, conn *pgx.Conn, s *Schema) (map[uint32]*catalogTable, error) {
	// Temporary tables come last so that they shadow their namesakes.
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text, c.relpersistence = 't',
  c.relrowsecurity
  OR (c.relkind = 'r' AND c.relhassubclass)
  OR EXISTS (SELECT 1 FROM (SELECT c.oid AS relid UNION SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)) pt JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = pt.relid WHERE NOT tg.tgisinternal)
  OR EXISTS (SELECT 1 FROM (SELECT c.oid AS relid UNION SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)) pt JOIN pg_catalog.pg_rewrite r ON r.ev_class = pt.relid WHERE r.rulename <> '_RETURN')
  OR EXISTS (SELECT 1 FROM (SELECT c.oid AS relid UNION SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)) pt
     JOIN pg_catalog.pg_attrdef d ON d.adrelid = pt.relid
     JOIN pg_catalog.pg_depend dep ON dep.classid = 'pg_catalog.pg_attrdef'::regclass AND dep.objid = d.oid AND dep.refclassid = 'pg_catalog.pg_proc'::regclass
     JOIN pg_catalog.pg_proc p ON p.oid = dep.refobjid
     WHERE p.pronamespace <> 'pg_catalog'::regnamespace)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND `+catalogNamespaces+`
ORDER BY c.relpersistence = 't', c.oid`)
	if err != nil {
		return nil, fmt.Errorf("quma: catalog: tables: %w", err)
	}
	defer rows.Close()
	tables := map[uint32]*catalogTable{}
	for rows.Next() {
		var (
			oid                 uint32
			nsp, rel, replIdent string
			temp, runsCode      bool
		)
		if err := rows.Scan(&oid, &nsp, &rel, &replIdent, &temp, &runsCode); err != nil {
			return nil, fmt.Errorf("quma: catalog: tables: %w", err)
		}
		name := nsp + "." + rel
		if temp {
			name = catalogTempName(s, rel)
		}
		t := &Table{Name: name, Temporary: temp, RunsCode: runsCode}
		switch replIdent {
		case "d":
			t.ReplicaIdentity = "default"
		case "f":
			t.ReplicaIdentity = "full"
		case "n":
			t.ReplicaIdentity = "nothing"
		case "i":
			t.ReplicaIdentity = "index"
		default:
			return nil, fmt.Errorf("quma: catalog: table %s: relreplident %q", name, replIdent)
		}
		if old := s.Tables[name]; old != nil {
			for oid, ct := range tables {
				if ct.t == old {
					delete(tables, oid)
				}
			}
		}
		s.Tables[name] = t
		tables[oid] = &catalogTable{t: t, ident: replIdent}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quma: catalog: tables: %w", err)
	}
	return tables, nil
}

func catalogOids(tables map[uint32]*catalogTable) []uint32 {
	oids := make([]uint32, 0, len(tables))
	for oid := range tables {
		oids = append(oids, oid)
	}
	return oids
}

// catalogColumns loads columns, naming a domain-typed column by its base
// type (a domain over a domain included) so that Keyable sees the type whose
// text form it knows.
func catalogColumns(ctx context.Context, conn *pgx.Conn, tables map[uint32]*catalogTable) error {
	rows, err := conn.Query(ctx, `
WITH RECURSIVE base(typ, base, depth) AS (
	SELECT t.oid, t.typbasetype, 1 FROM pg_catalog.pg_type t WHERE t.typtype = 'd'
	UNION ALL
	SELECT b.typ, t.typbasetype, b.depth + 1
	FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.base
	WHERE t.typtype = 'd' AND b.depth < 100
), resolved AS (
	SELECT DISTINCT ON (b.typ) b.typ, t.typname
	FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.base
	ORDER BY b.typ, b.depth DESC
)
SELECT a.attrelid, a.attname::text, COALESCE(r.typname, t.typname)::text, a.attnotnull
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN resolved r ON r.typ = a.atttypid
WHERE a.attrelid = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum`, catalogOids(tables))
	if err != nil {
		return fmt.Errorf("quma: catalog: columns: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			rel uint32
			c   Column
		)
		if err := rows.Scan(&rel, &c.Name, &c.Type, &c.NotNull); err != nil {
			return fmt.Errorf("quma: catalog: columns: %w", err)
		}
		if ct := tables[rel]; ct != nil {
			ct.t.Columns = append(ct.t.Columns, c)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quma: catalog: columns: %w", err)
	}
	return nil
}

// catalogKeys loads primary keys, unique keys and replica identity columns
// from the unique indexes, in creation order. Only the key columns of an
// index count, not its INCLUDE columns. Deferrable constraints count: the
// cache reads committed rows, which satisfy them. Invalid indexes do not: a
// failed CREATE UNIQUE INDEX CONCURRENTLY leaves one over duplicate rows.
func catalogKeys(ctx context.Context, conn *pgx.Conn, tables map[uint32]*catalogTable) error {
	rows, err := conn.Query(ctx, `
SELECT i.indrelid, i.indisprimary, i.indisreplident,
	i.indexprs IS NULL AND i.indpred IS NULL AND i.indisvalid,
	ARRAY(
		SELECT a.attname::text
		FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE k.ord <= i.indnkeyatts
		ORDER BY k.ord)
FROM pg_catalog.pg_index i
WHERE i.indrelid = ANY($1) AND i.indisunique
ORDER BY i.indrelid, i.indexrelid`, catalogOids(tables))
	if err != nil {
		return fmt.Errorf("quma: catalog: keys: %w", err)
	}
	defer rows.Close()
	uniques := map[uint32][][]string{}
	identity := map[uint32][]string{}
	for rows.Next() {
		var (
			rel                     uint32
			primary, replIdent, key bool
			cols                    []string
		)
		if err := rows.Scan(&rel, &primary, &replIdent, &key, &cols); err != nil {
			return fmt.Errorf("quma: catalog: keys: %w", err)
		}
		ct := tables[rel]
		if ct == nil {
			continue
		}
		if replIdent {
			identity[rel] = cols
		}
		switch {
		case !key:
		case primary:
			ct.t.PrimaryKey = cols
		default:
			uniques[rel] = append(uniques[rel], cols)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quma: catalog: keys: %w", err)
	}
	for rel, ct := range tables {
		t := ct.t
		t.UniqueKeys = ddlDedupKeys(t.PrimaryKey, uniques[rel])
		switch t.ReplicaIdentity {
		case "default":
			t.IdentityColumns = ddlClone(t.PrimaryKey)
		case "full":
			t.IdentityColumns = t.ColumnNames()
		case "index":
			// Without its index (dropped since) the identity is empty, as
			// PostgreSQL then logs no old key.
			t.IdentityColumns = ddlClone(identity[rel])
		}
	}
	return nil
}

func catalogViews(ctx context.Context, conn *pgx.Conn, s *Schema) error {
	rows, err := conn.Query(ctx, `
SELECT n.nspname::text, c.relname::text, c.relpersistence = 't', pg_catalog.pg_get_viewdef(c.oid, true)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('v', 'm') AND `+catalogNamespaces+`
ORDER BY c.relpersistence = 't', c.oid`)
	if err != nil {
		return fmt.Errorf("quma: catalog: views: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			nsp, rel, def string
			temp          bool
		)
		if err := rows.Scan(&nsp, &rel, &temp, &def); err != nil {
			return fmt.Errorf("quma: catalog: views: %w", err)
		}
		name := nsp + "." + rel
		if temp {
			name = catalogTempName(s, rel)
		}
		s.Views[name] = &View{Name: name, Query: strings.TrimSuffix(strings.TrimSpace(def), ";")}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quma: catalog: views: %w", err)
	}
	return nil
}

// catalogFunctions loads the volatility of functions outside the system
// schemas. Procedures and aggregates are left out: procedures cannot appear
// in a query, and an aggregate's provolatile says nothing of its state
// functions.
func catalogFunctions(ctx context.Context, conn *pgx.Conn, s *Schema) error {
	rows, err := conn.Query(ctx, `
SELECT n.nspname::text, p.proname::text, p.provolatile::text
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE p.prokind IN ('f', 'w') AND `+catalogNamespaces+`
ORDER BY p.oid`)
	if err != nil {
		return fmt.Errorf("quma: catalog: functions: %w", err)
	}
	defer rows.Close()
	sigs := map[string]map[string]Volatility{}
	for rows.Next() {
		var nsp, name, vol string
		if err := rows.Scan(&nsp, &name, &vol); err != nil {
			return fmt.Errorf("quma: catalog: functions: %w", err)
		}
		q := nsp + "." + name
		if sigs[q] == nil {
			sigs[q] = map[string]Volatility{}
		}
		// One entry per volatility is enough to fold overloads.
		sigs[q][vol] = Volatility(vol)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quma: catalog: functions: %w", err)
	}
	for name, vols := range sigs {
		s.Functions[name] = ddlMostVolatile(vols)
	}
	return nil
}
