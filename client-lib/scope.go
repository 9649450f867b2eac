package larder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// sessionScope is what a session's results depend on besides the
// statement: key names the roles and every setting; path is the search
// path as PostgreSQL resolves it for the session (current_schemas).
// temp: the session has a temporary schema, whose tables come first on
// its path and may shadow any name; the catalog the client reads cannot
// see them, so nothing the session reads is cached.
type sessionScope struct {
	key  string
	path []string
	temp bool
	// uncached says why nothing the session reads can be cached ("" if
	// it can): a client encoding other than UTF8, or
	// standard_conforming_strings off, under which the analyzer could read
	// literals and parameters otherwise than the server.
	uncached string
}

// scopeNamesSQL lists the settings a result can depend on: every setting
// a session can set (not the server-wide ones of contexts internal,
// postmaster and sighup, which every session shares, and some of which
// only privileged roles may read) but the client's name and the
// transaction-scoped ones (scopes are read outside transactions), and the
// custom settings (app.tenant, read by a
// row-level-security policy), which pg_settings does not list while they
// are placeholders: the names that policies, views and the database's
// own functions read with current_setting('…').
const scopeNamesSQL = `WITH custom AS (
  SELECT DISTINCT lower(m[1]) AS name
  FROM (SELECT coalesce(qual, '') || ' ' || coalesce(with_check, '') AS src FROM pg_catalog.pg_policies
        UNION ALL SELECT definition FROM pg_catalog.pg_views WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
        UNION ALL SELECT p.prosrc FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')) s,
    regexp_matches(s.src, 'current_setting\(\s*''([^'']+)''', 'g') AS m
  WHERE position('.' in m[1]) > 0
)
SELECT name FROM pg_catalog.pg_settings
WHERE name NOT IN ('application_name', 'transaction_isolation', 'transaction_read_only', 'transaction_deferrable')
  AND context NOT IN ('internal', 'postmaster', 'sighup')
UNION SELECT name FROM custom
ORDER BY 1`

// scopeQuery reads a session's scope in one statement whose text is fixed
// for a catalog (pgx prepares it once per connection): the roles, every
// setting of names by current_setting, the resolved search path and
// whether the session has a temporary schema. Reading pg_settings itself
// costs several times more on the server, and sessions' scopes are read
// after every statement that may have changed them.
type scopeQuery struct {
	sql   string
	names []string
}

// loadScopeQuery lists the setting names (scopeNamesSQL) and builds the
// statement that reads them.
func loadScopeQuery(ctx context.Context, conn dbConn) (*scopeQuery, error) {
	rows, err := conn.Query(ctx, scopeNamesSQL)
	if err != nil {
		return nil, fmt.Errorf("larder: list the settings: %w", err)
	}
	q := &scopeQuery{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, fmt.Errorf("larder: list the settings: %w", err)
		}
		q.names = append(q.names, name)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("larder: list the settings: %w", err)
	}
	var b strings.Builder
	b.WriteString("SELECT current_user, session_user, ARRAY[")
	for i, name := range q.names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("pg_catalog.current_setting('" + strings.ReplaceAll(name, "'", "''") + "', true)")
	}
	b.WriteString("]::text[], pg_catalog.current_schemas(false)::text[], pg_catalog.pg_my_temp_schema() <> 0")
	q.sql = b.String()
	return q, nil
}

// read reads a session's scope.
func (q *scopeQuery) read(ctx context.Context, conn dbConn) (sessionScope, error) {
	var sc sessionScope
	var current, session string
	var values []pgtype.Text
	if err := conn.QueryRow(ctx, q.sql).Scan(&current, &session, &values, &sc.path, &sc.temp); err != nil {
		return sc, fmt.Errorf("larder: read the session's roles and settings: %w", err)
	}
	if len(values) != len(q.names) {
		return sc, fmt.Errorf("larder: read the session's settings: %d values for %d names", len(values), len(q.names))
	}
	h := sha256.New()
	for i, name := range q.names {
		v := "<null>"
		if values[i].Valid {
			v = "=" + values[i].String
		}
		switch {
		case name == "client_encoding" && values[i].Valid && !strings.EqualFold(values[i].String, "UTF8"):
			sc.uncached = "the session's client_encoding is " + values[i].String + ", not UTF8"
		case name == "standard_conforming_strings" && values[i].Valid && values[i].String != "on":
			sc.uncached = "the session has standard_conforming_strings off"
		}
		fmt.Fprintf(h, "%d:%s%d:%s\n", len(name), name, len(v), v)
	}
	sc.key = current + "\n" + session + "\n" + hex.EncodeToString(h.Sum(nil)) + "\n" + strings.Join(sc.path, ",")
	return sc, nil
}

// readScope reads the session state that changes results, with the
// client's current scope query; for a role that may not read a setting it
// names (42501), with one made on the session's own connection, which
// lists what that role may read (kept per role until the next reload).
func (c *Client) readScope(ctx context.Context, conn dbConn) (sessionScope, error) {
	sc, err := c.scope.Load().read(ctx, conn)
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Code != insufficientPrivilege {
		return sc, err
	}
	if pc := pgConnOf(conn); pc != nil && pc.TxStatus() != 'I' {
		return sc, err // in a failed transaction: nothing more can run
	}
	epoch := c.epoch.Load()
	role := ""
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		return sc, err
	}
	c.roleScopesMu.Lock()
	own := c.roleScopes[role]
	if own != nil && own.epoch != epoch {
		own = nil
	}
	c.roleScopesMu.Unlock()
	if own == nil {
		q, err := loadScopeQuery(ctx, conn)
		if err != nil {
			return sc, err
		}
		own = &roleScope{q: q, epoch: epoch}
		c.roleScopesMu.Lock()
		if c.roleScopes == nil || len(c.roleScopes) >= 256 {
			c.roleScopes = map[string]*roleScope{}
		}
		c.roleScopes[role] = own
		c.roleScopesMu.Unlock()
	}
	return own.q.read(ctx, conn)
}

// roleScope is a scope query made on a connection of a role that may not
// read every setting the client's names, in a catalog epoch.
type roleScope struct {
	q     *scopeQuery
	epoch uint64
}
