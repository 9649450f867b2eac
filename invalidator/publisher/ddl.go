package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DDLPrefix is the prefix of the transactional logical decoding messages
// the invalidator's event triggers write for every schema change. The
// payload is JSON (see ddlPayload); a message is decoded at its
// transaction's commit, in commit order with the row changes.
const DDLPrefix = "larder.ddl"

// The event triggers and their functions, installed (and kept current) by
// every invalidator at start. They are database objects: they fire for
// every DDL of every session, also while no invalidator runs, and the
// messages they write wait in the WAL for the slot.
const (
	ddlEndFunction  = "public.larder_ddl_command_end"
	ddlDropFunction = "public.larder_ddl_sql_drop"
	ddlEndTrigger   = "larder_ddl_command_end"
	ddlDropTrigger  = "larder_ddl_sql_drop"
)

// ddlEndBody names, for every command ddl_command_end reports, the tables
// whose results it can change: a table itself, an index's table, a
// policy's, trigger's, constraint's or default's table, with the whole
// partition tree around each. Anything else (functions, views, types,
// schemas, GRANT/REVOKE, ALTER DEFAULT PRIVILEGES, extensions, …) is
// "global". Temporary relations are left out. Sequences and TOAST tables
// change no result.
const ddlEndBody = `
DECLARE
  r record;
  rel oid;
  kind "char";
  pers "char";
  glob boolean := false;
  rels oid[] := '{}';
  tabs jsonb;
BEGIN
  FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
    rel := NULL;
    IF r.classid IS NULL THEN
      glob := true;
    ELSIF r.classid = 'pg_class'::regclass THEN
      SELECT c.relkind, c.relpersistence INTO kind, pers FROM pg_class c WHERE c.oid = r.objid;
      IF pers = 't' THEN
        NULL;
      ELSIF kind IN ('r', 'p') THEN
        rel := r.objid;
      ELSIF kind IN ('i', 'I') THEN
        SELECT i.indrelid INTO rel FROM pg_index i WHERE i.indexrelid = r.objid;
      ELSIF kind IN ('S', 't') THEN
        NULL;
      ELSE
        glob := true;
      END IF;
    ELSIF r.classid = 'pg_policy'::regclass THEN
      SELECT p.polrelid INTO rel FROM pg_policy p WHERE p.oid = r.objid;
    ELSIF r.classid = 'pg_trigger'::regclass THEN
      SELECT t.tgrelid INTO rel FROM pg_trigger t WHERE t.oid = r.objid;
    ELSIF r.classid = 'pg_attrdef'::regclass THEN
      SELECT d.adrelid INTO rel FROM pg_attrdef d WHERE d.oid = r.objid;
    ELSIF r.classid = 'pg_constraint'::regclass THEN
      SELECT nullif(c.conrelid, 0) INTO rel FROM pg_constraint c WHERE c.oid = r.objid;
      glob := glob OR rel IS NULL;
    ELSE
      glob := true;
    END IF;
    IF rel IS NOT NULL THEN
      rels := rels || rel;
    END IF;
  END LOOP;
  SELECT coalesce(jsonb_agg(jsonb_build_object('oid', c.oid::bigint, 'schema', n.nspname, 'name', c.relname) ORDER BY c.oid), '[]')
    INTO tabs
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relpersistence <> 't' AND c.relkind IN ('r', 'p') AND c.oid IN (
      SELECT u FROM unnest(rels) u
      UNION SELECT t.relid FROM unnest(rels) u, pg_partition_tree(u) t
      UNION SELECT a.relid FROM unnest(rels) u, pg_partition_ancestors(u) a);
  IF glob OR jsonb_array_length(tabs) > 0 THEN
    PERFORM pg_logical_emit_message(true, 'larder.ddl',
      jsonb_build_object('v', 1, 'tag', tg_tag, 'global', glob, 'tables', tabs)::text);
  END IF;
END`

// ddlDropBody names the tables a drop removed or changed. Dropped tables
// travel with their OID and their last name; dropped indexes by OID (the
// invalidator knows which table a key index belonged to); columns,
// policies, triggers, constraints and defaults by their table's name.
// The row types and TOAST tables a dropped table takes along are left
// out; any other dropped object is "global".
const ddlDropBody = `
DECLARE
  r record;
  glob boolean := false;
  tabs jsonb := '[]';
  idx jsonb := '[]';
BEGIN
  FOR r IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
    CONTINUE WHEN r.is_temporary OR r.address_names[1] = 'pg_temp';
    IF r.classid = 'pg_class'::regclass THEN
      IF r.objsubid <> 0 OR r.object_type = 'table' THEN
        tabs := tabs || jsonb_build_object('oid', r.objid::bigint, 'schema', r.address_names[1], 'name', r.address_names[2]);
      ELSIF r.object_type = 'index' THEN
        idx := idx || to_jsonb(r.objid::bigint);
      ELSIF r.object_type IN ('sequence', 'toast table') THEN
        NULL;
      ELSE
        glob := true;
      END IF;
    ELSIF r.classid IN ('pg_policy'::regclass, 'pg_trigger'::regclass, 'pg_attrdef'::regclass, 'pg_rewrite'::regclass)
       OR r.object_type = 'table constraint' THEN
      tabs := tabs || jsonb_build_object('oid', 0, 'schema', r.address_names[1], 'name', r.address_names[2]);
    ELSIF r.classid = 'pg_type'::regclass AND NOT r.original THEN
      NULL;
    ELSE
      glob := true;
    END IF;
  END LOOP;
  IF glob OR jsonb_array_length(tabs) > 0 OR jsonb_array_length(idx) > 0 THEN
    PERFORM pg_logical_emit_message(true, 'larder.ddl',
      jsonb_build_object('v', 1, 'tag', tg_tag, 'global', glob, 'tables', tabs, 'indexes', idx)::text);
  END IF;
END`

// ddlPayload is a larder.ddl message.
type ddlPayload struct {
	V       int        `json:"v"`
	Tag     string     `json:"tag"`    // the command tag, for logs
	Global  bool       `json:"global"` // every covered table
	Tables  []ddlTable `json:"tables"`
	Indexes []uint32   `json:"indexes"` // dropped indexes
}

type ddlTable struct {
	OID    uint32 `json:"oid"` // 0 when not known
	Schema string `json:"schema"`
	Name   string `json:"name"`
}

func parseDDL(b []byte) (ddlPayload, error) {
	var d ddlPayload
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("publisher: %s message: %w", DDLPrefix, err)
	}
	if d.V != 1 {
		return d, fmt.Errorf("publisher: %s message version %d; this build reads 1", DDLPrefix, d.V)
	}
	return d, nil
}

// DDLTriggerError says the event triggers that make schema changes
// invalidate by themselves are missing or outdated, and the user may not
// install them.
type DDLTriggerError struct{ Err error }

func (e *DDLTriggerError) Error() string {
	return "invalidator: the DDL event triggers (" + ddlEndTrigger + ", " + ddlDropTrigger + ") are missing or outdated and could not be installed: " +
		e.Err.Error() + "\n" +
		"event triggers need a superuser: start the invalidator once as a superuser (it installs them and later runs need not be),\n" +
		"or start it with --ddl-trigger=false to accept that a schema change invalidates only when its table's next row change is decoded"
}

func (e *DDLTriggerError) Unwrap() error { return e.Err }

// ensureDDLTrigger installs the event triggers unless they are in place
// and current. Installing writes a global larder.ddl message in the same
// transaction: schema changes made before the triggers existed could not
// be seen.
func (p *Publisher) ensureDDLTrigger(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	err := conn.QueryRow(ctx, `
SELECT count(*) = 2 FROM pg_event_trigger e JOIN pg_proc f ON f.oid = e.evtfoid
WHERE e.evtenabled = 'A' AND e.evttags IS NULL AND (
  (e.evtname = $1 AND e.evtevent = 'ddl_command_end' AND f.oid = to_regprocedure($3 || '()') AND f.prosrc = $5) OR
  (e.evtname = $2 AND e.evtevent = 'sql_drop' AND f.oid = to_regprocedure($4 || '()') AND f.prosrc = $6))`,
		ddlEndTrigger, ddlDropTrigger, ddlEndFunction, ddlDropFunction, ddlEndBody, ddlDropBody).Scan(&ok)
	if err != nil {
		return fmt.Errorf("publisher: look up the DDL event triggers: %w", err)
	}
	if ok {
		return nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, s := range []string{
			`CREATE OR REPLACE FUNCTION ` + ddlEndFunction + `() RETURNS event_trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $larder$` + ddlEndBody + `$larder$`,
			`CREATE OR REPLACE FUNCTION ` + ddlDropFunction + `() RETURNS event_trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $larder$` + ddlDropBody + `$larder$`,
			`DROP EVENT TRIGGER IF EXISTS ` + ddlEndTrigger,
			`DROP EVENT TRIGGER IF EXISTS ` + ddlDropTrigger,
			`CREATE EVENT TRIGGER ` + ddlEndTrigger + ` ON ddl_command_end EXECUTE FUNCTION ` + ddlEndFunction + `()`,
			`CREATE EVENT TRIGGER ` + ddlDropTrigger + ` ON sql_drop EXECUTE FUNCTION ` + ddlDropFunction + `()`,
			// Also in sessions with session_replication_role = replica.
			`ALTER EVENT TRIGGER ` + ddlEndTrigger + ` ENABLE ALWAYS`,
			`ALTER EVENT TRIGGER ` + ddlDropTrigger + ` ENABLE ALWAYS`,
			`SELECT pg_logical_emit_message(true, '` + DDLPrefix + `', '{"v": 1, "tag": "larder: DDL triggers installed", "global": true, "tables": []}')`,
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return &DDLTriggerError{Err: err}
	}
	if err != nil {
		// Anything else (two invalidators installing at once) is worth
		// another try.
		return fmt.Errorf("publisher: install the DDL event triggers: %w", err)
	}
	p.cfg.Log.Info("installed the DDL event triggers", "triggers", ddlEndTrigger+", "+ddlDropTrigger)
	return nil
}

// applyDDL turns the larder.ddl messages of the transaction being
// committed into flushes in its change set, then makes the reloaded
// catalog current: every table a message names (by its name at the
// command and, through its OID, by the name the publisher knew), the
// table a dropped key index belonged to, every covered table for a
// global message, and every table whose tag sets or identity the reload
// changed. Only tables covered before or after are flushed. It returns
// the tables flushed.
func (p *Publisher) applyDDL(ctx context.Context, xid uint32) ([]string, error) {
	before := p.tables
	after, err := p.loadCatalog(ctx, xid)
	if err != nil {
		return nil, err
	}
	byOID := map[uint32]string{}
	byIndex := map[uint32]string{}
	for name, t := range before {
		byOID[t.oid] = name
		for _, i := range t.keyIndexes {
			byIndex[i] = name
		}
	}
	affected := map[string]bool{}
	named := map[uint32]bool{} // OIDs the messages name
	covered := func(name string) bool { return before[name] != nil || after[name] != nil }
	global := false
	for _, d := range p.ddl {
		global = global || d.Global
		for _, t := range d.Tables {
			if name := t.Schema + "." + t.Name; covered(name) {
				affected[name] = true
			}
			if t.OID == 0 {
				continue
			}
			named[t.OID] = true
			if name, ok := byOID[t.OID]; ok {
				affected[name] = true // its name before a RENAME or SET SCHEMA
			}
			if r := p.relations[t.OID]; r != nil && covered(r.name) {
				affected[r.name] = true
			}
		}
		for _, i := range d.Indexes {
			if name, ok := byIndex[i]; ok {
				affected[name] = true
			}
		}
	}
	for name, t := range before {
		if global {
			affected[name] = true
		} else if n := after[name]; n != nil && !t.sameInfo(n) {
			affected[name] = true
		}
	}
	if global {
		for name := range after {
			affected[name] = true
		}
	}
	names := make([]string, 0, len(affected))
	for name := range affected {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p.cs.flush(name)
	}
	p.m.flushes.WithLabelValues("ddl").Add(float64(len(names)))

	p.tables = after
	p.syncDerived()
	p.noteSets()
	for id, r := range p.relations {
		// The next Relation message of a table a DDL named shows its new
		// shape: already flushed at the DDL's commit, not again.
		if affected[r.name] || named[id] {
			r.afterDDL = true
		}
		var sets [][]string
		if t := after[r.name]; t != nil {
			sets = t.sets
		} else {
			sets = p.setsOf(r.name)
		}
		if !equalSets(r.given, sets) {
			p.relations[id] = r.withSets(sets)
		}
	}
	p.identityAfterDDL(ctx, before, after)
	var tags []string
	for _, d := range p.ddl {
		tags = append(tags, d.Tag)
	}
	p.cfg.Log.Info("schema change", "commands", strings.Join(tags, "; "), "flushed", strings.Join(names, ", "), "tables", len(after))
	return names, nil
}

// loadCatalog reads the publication's tables, as transaction xid (0:
// any) left them, and chooses their tag sets. The connection is shared
// with the heartbeats.
func (p *Publisher) loadCatalog(ctx context.Context, xid uint32) (map[string]*tableInfo, error) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if xid != 0 {
		if err := awaitVisible(ctx, p.conn, xid); err != nil {
			return nil, err
		}
	}
	tables, err := loadTables(ctx, p.conn, p.cfg.Publication)
	if err != nil {
		return nil, err
	}
	p.chooseSets(tables)
	return tables, nil
}

// awaitVisible waits until transaction xid (32 bits, as pgoutput gives
// it) is visible to new snapshots. Its commit record can be decoded
// before the server has removed it from the proc array: a catalog read
// at that moment would still see the catalog from before it.
func awaitVisible(ctx context.Context, conn *pgx.Conn, xid uint32) error {
	// The 64-bit xid is the one in the epoch of the snapshot's xmax that
	// lies within 2^31 of it.
	const q = `
SELECT pg_visible_in_snapshot(
  (CASE WHEN c - m >= 2147483648 THEN c - 4294967296 ELSE c END)::text::xid8, s)
FROM (SELECT s, m, ((m >> 32) << 32) | $1::bigint AS c
      FROM (SELECT s, pg_snapshot_xmax(s)::text::bigint AS m FROM pg_current_snapshot() s) a) b`
	deadline := time.Now().Add(ackTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		var visible bool
		if err := conn.QueryRow(ctx, q, int64(xid)).Scan(&visible); err != nil {
			return fmt.Errorf("publisher: is transaction %d visible: %w", xid, err)
		}
		if visible {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("publisher: transaction %d not visible %s after its commit was decoded", xid, ackTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// sameInfo reports whether two readings of a table's catalog entry
// publish the same tags.
func (t *tableInfo) sameInfo(o *tableInfo) bool {
	return t.oid == o.oid && t.identity == o.identity && equalSets([][]string{t.idCols}, [][]string{o.idCols}) && equalSets(t.sets, o.sets)
}

func equalSets(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], "\x00") != strings.Join(b[i], "\x00") || len(a[i]) != len(b[i]) {
			return false
		}
	}
	return true
}
