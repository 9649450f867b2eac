package main

// Several application servers (--app-servers N): Ferdinand's Table 1 and
// Figure 6. Each application server is an application instance with its
// own Larder client (its own L1 and connection pool) and its own home
// node; k6's virtual user k is bound to server (k-1) mod N. Modes:
//
//   - direct: N application servers on PostgreSQL;
//   - local-only: server i on the i-th standalone node of the stack
//     (LARDER_STANDALONE_NODES: `local up -standalone-cache-nodes N`),
//     which caches alone: Ferdinand's SIMPLECACHE;
//   - cooperative: server i with the i-th overlay node as its home
//     (LARDER_CACHE_NODES: `local up -cache-nodes N`), the home placement:
//     each key's lookups and puts go to its master, so the N nodes cache
//     as one.
//
// Besides the client's reads, each run records PostgreSQL's statements
// (pg_stat_statements, when the stack preloads it) and transactions, and
// the invalidation messages each node of the mode received.

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	larder "github.com/larderdb/larder/client-lib"
)

// appServers is --app-servers; appL1 each server's L1 (--app-l1);
// appNodeTimeout its cache-node calls' timeout (--app-node-timeout).
var (
	appServers     = 1
	appL1          = 32 << 20
	appNodeTimeout = time.Second
)

func init() {
	flag.IntVar(&appServers, "app-servers", appServers, "application servers, each with its own Larder client and home node (more than one: modes direct, local-only and cooperative; see cluster.go)")
	flag.IntVar(&appL1, "app-l1", appL1, "bytes of each application server's L1 with --app-servers")
	flag.DurationVar(&appNodeTimeout, "app-node-timeout", appNodeTimeout, "larder.node-timeout of each application server with --app-servers: long enough that a loaded machine does not open the nodes' breakers (reads that skip the node would count as misses)")
}

// clusterModes are the modes with more than one application server.
var clusterModes = []string{"direct", "local-only", "cooperative"}

// checkCluster refuses modes that do not run with several application
// servers and returns what the report's machine line says about them.
func checkCluster(modes []string) (string, error) {
	if appServers <= 1 {
		return "", nil
	}
	for _, m := range modes {
		if !slices.Contains(clusterModes, m) {
			return "", fmt.Errorf("mode %s: with --app-servers %d, the modes are %s", m, appServers, strings.Join(clusterModes, ", "))
		}
	}
	return fmt.Sprintf("; %d application servers, each with its own client (L1 %d MiB) and home node, the virtual users spread over them", appServers, appL1>>20), nil
}

// clusterDSNs are the DSNs of a mode's application servers ("" each for
// direct, which runs on LARDER_PG_URL).
func clusterDSNs(mode, label string, env map[string]string) ([]string, error) {
	n := appServers
	dsns := make([]string, n)
	if mode == "direct" {
		return dsns, nil
	}
	var nodes []string
	switch mode {
	case "local-only":
		nodes = splitList(env["LARDER_STANDALONE_NODES"])
		if len(nodes) < n {
			return nil, fmt.Errorf("local-only with %d application servers needs as many standalone cache-nodes, the stack has %d (local up -standalone-cache-nodes %d)", n, len(nodes), n)
		}
	case "cooperative":
		nodes = splitList(env["LARDER_CACHE_NODES"])
		if len(nodes) < n {
			return nil, fmt.Errorf("cooperative with %d application servers needs an overlay of as many cache-nodes, the stack has %d (local up -cache-nodes %d)", n, len(nodes), n)
		}
		nodes = nodes[:n]
	default:
		return nil, fmt.Errorf("mode %s: with --app-servers, the modes are %s", mode, strings.Join(clusterModes, ", "))
	}
	for i := range n {
		u, err := url.Parse(env["LARDER_DSN"])
		if err != nil {
			return nil, err
		}
		q := u.Query()
		if f := env["LARDER_QUMA"]; f != "" {
			q.Set("larder.quma", f)
		}
		if !registerTagSets {
			q.Set("larder.register-tag-sets", "false")
		}
		if !splitRows {
			q.Set("larder.split-rows", "false")
		}
		q.Set("larder.l1", strconv.Itoa(appL1))
		q.Set("larder.node-timeout", appNodeTimeout.String())
		if mode == "local-only" {
			// Its own node only, not a member of any overlay.
			q.Set("larder.nodes", nodes[i])
			q.Del("larder.node-placement")
		} else {
			// Its home node first; the others stand in while its breaker
			// is open.
			q.Set("larder.nodes", strings.Join(append(append([]string{}, nodes[i:]...), nodes[:i]...), ","))
			q.Set("larder.node-placement", larder.PlacementHome)
		}
		// Each server its own client: the driver shares one per DSN.
		q.Set("application_name", fmt.Sprintf("rubis-%s-%d", label, i+1))
		u.RawQuery = q.Encode()
		dsns[i] = u.String()
	}
	return dsns, nil
}

// nodeMetrics are the /metrics endpoints of a mode's nodes.
func nodeMetrics(mode string, env map[string]string) []string {
	var all []string
	switch mode {
	case "local-only":
		all = splitList(env["LARDER_STANDALONE_NODES_METRICS"])
	case "cooperative":
		all = splitList(env["LARDER_CACHE_NODES_METRICS"])
	}
	return all[:min(len(all), appServers)]
}

// serveCluster serves a mode's application servers, each on its own port;
// the base URL lists them, comma-separated (k6/rubis.js binds each
// virtual user to one).
func (b *bench) serveCluster(ctx context.Context, vr variant) (string, func(), error) {
	dsns, err := clusterDSNs(vr.mode, vr.label, b.env)
	if err != nil {
		return "", nil, err
	}
	b.pgStatsOnce.Do(func() { b.pgStats = enablePGStatStatements(ctx, b.env["LARDER_PG_URL"]) })
	var bases []string
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	for _, dsn := range dsns {
		var db *sql.DB
		if dsn == "" {
			db, err = sql.Open("pgx", b.env["LARDER_PG_URL"])
		} else {
			db, err = sql.Open(larder.DriverName, dsn)
		}
		if err != nil {
			stopAll()
			return "", nil, err
		}
		db.SetMaxOpenConns(16)
		db.SetMaxIdleConns(16)
		base, stop, err := serve(db, vr.staleness, true, false)
		if err != nil {
			db.Close()
			stopAll()
			return "", nil, err
		}
		bases = append(bases, base)
		stops = append(stops, func() { stop(); db.Close() })
	}
	return strings.Join(bases, ","), stopAll, nil
}

// clusterReads are a mode's counters, summed over its application servers:
// the clients' reads (as readsOf), PostgreSQL's statements (pg-statements,
// with pg_stat_statements) and transactions (pg-xacts), and the
// invalidation messages each of the mode's nodes received (inv-node-NN).
func (b *bench) clusterReads(vr variant) map[string]int64 {
	m := map[string]int64{}
	dsns, err := clusterDSNs(vr.mode, vr.label, b.env)
	if err != nil {
		return m
	}
	for _, dsn := range dsns {
		if dsn == "" {
			continue
		}
		st, ok := larder.DriverStats(dsn)
		if !ok {
			continue
		}
		add := statsOf(st)
		for k, v := range add {
			m[k] += v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if xacts, stmts, err := pgCounters(ctx, b.env["LARDER_PG_URL"], b.pgStats); err == nil {
		m["pg-xacts"] = xacts
		if b.pgStats {
			m["pg-statements"] = stmts
		}
	}
	for i, endpoint := range nodeMetrics(vr.mode, b.env) {
		if v, err := scrapeCounter(ctx, endpoint, "larder_node_invalidation_messages_received_total"); err == nil {
			m[fmt.Sprintf("inv-node-%02d", i+1)] = int64(v)
		}
	}
	return m
}

// enablePGStatStatements creates pg_stat_statements and reports whether
// its view answers (the stack must preload it: local up -pg-settings
// shared_preload_libraries=pg_stat_statements).
func enablePGStatStatements(ctx context.Context, pgURL string) bool {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false
	}
	var n int64
	return conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
}

// invalidatorStatements match the statements the invalidator and its
// pincushion run (heartbeats, pins, the slot's checks), which are not the
// application's work.
const invalidatorStatements = `query LIKE '%pg_logical_emit_message%' OR query LIKE '%pg_export_snapshot%' OR query LIKE '%pg_replication_slots%'`

// pgCounters reads the database's committed and rolled-back transactions
// and, with statements, the calls pg_stat_statements counted, the
// invalidator's own statements left out.
func pgCounters(ctx context.Context, pgURL string, statements bool) (xacts, stmts int64, err error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()").Scan(&xacts); err != nil {
		return 0, 0, err
	}
	if statements {
		err = conn.QueryRow(ctx, "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE NOT ("+invalidatorStatements+")").Scan(&stmts)
	}
	return xacts, stmts, err
}

// scrapeCounter sums a counter's series at a Prometheus endpoint.
func scrapeCounter(ctx context.Context, endpoint, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return sumCounter(string(body), name)
}

// sumCounter sums the samples of a metric in Prometheus' text format.
func sumCounter(text, name string) (float64, error) {
	sum, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // another metric with this prefix
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, nil // a vector with no series yet
	}
	return sum, nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// pgStatsState is what the servers' runs share about pg_stat_statements.
type pgStatsState struct {
	pgStatsOnce sync.Once
	pgStats     bool
}
