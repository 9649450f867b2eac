package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/invalidator/publisher"
	"github.com/larderdb/larder/invalidator/service"
	"github.com/larderdb/larder/qumaana/quma"
)

// Config configures the local stack.
type Config struct {
	// Dir keeps every server's data across restarts: Dir/pg, Dir/nats, Dir/redis.
	Dir string
	// PostgresPort, NATSPort and RedisPort are fixed so that a newcomer's
	// tools find the stack at the same place every time; 0 picks free ports.
	PostgresPort, NATSPort, RedisPort int
	// NATSBin runs that nats-server binary as its own process, as a
	// deployment would; empty embeds NATS in this process.
	NATSBin string
	// InvalidatorMetrics is the address of the invalidator's /metrics
	// ("127.0.0.1:0" picks a free port, "" serves none).
	InvalidatorMetrics string
	// CacheNodePort is the cache-node's protocol port on 127.0.0.1 (0: a
	// free port); CacheNodeMemory its byte budget.
	CacheNodePort   int
	CacheNodeMemory int64
	// CacheNodes is how many cache-nodes run (0 or 1: one). More than one
	// join a libp2p overlay (a pre-shared network key and the allow-list
	// of their peer IDs, generated in Dir/secrets), each on its own ports
	// (CacheNodePort, CacheNodePort+1, …, and the metrics likewise), and
	// LARDER_DSN lists them all with larder.node-placement=home: the first
	// is the application's home node, which forwards each key to its
	// master.
	CacheNodes int
	// StandaloneCacheNodes more cache-nodes run outside the overlay, on
	// the ports after the overlay's (and the metrics likewise), each
	// caching alone: the benchmarks' local-only caching beside the
	// cooperative overlay (LARDER_STANDALONE_NODES). LARDER_DSN does not
	// list them.
	StandaloneCacheNodes int
	// OverlayLatency is added to every request a node forwards to another
	// (overlay.Config.AddedLatency): an emulation of slower links between
	// nodes, for the benchmarks.
	OverlayLatency time.Duration
	// BroadcastInvalidation runs the cache-nodes in the broadcast ablation
	// (cache-node --broadcast-invalidation).
	BroadcastInvalidation bool
	// InvalidatorQUMA is the application's QUMA file: the invalidator
	// publishes its tag column sets from the start ("": each table's keys),
	// and LARDER_DSN names it, so the application's clients key their
	// results on its sets (registering with the invalidator any it does not
	// publish yet: no restart needed for a new set or a new table).
	InvalidatorQUMA string
	// FixReplicaIdentity lets the invalidator run the ALTER TABLE … REPLICA
	// IDENTITY FULL its start-up check asks for. Without it, a table whose
	// identity lacks its tag columns keeps the invalidator waiting (and
	// retrying every few seconds), with PostgreSQL up for the fix.
	FixReplicaIdentity bool
	// PinMaxAge is how long the pincushion keeps a pin (the invalidator's
	// --max-staleness; 0: its default).
	PinMaxAge time.Duration
	// CacheNodeMetrics is the address of the cache-node's /metrics
	// ("127.0.0.1:0" picks a free port, "" serves none).
	CacheNodeMetrics string
	// FrontPort is the PostgreSQL wire front's port on 127.0.0.1 (0: a
	// free port; < 0: no front); FrontMetrics the address of its /metrics
	// ("" for none).
	FrontPort    int
	FrontMetrics string
	// PostgresSettings are extra postgresql.conf settings (the
	// benchmarks' diagnostics: shared_preload_libraries=pg_stat_statements).
	PostgresSettings map[string]string
	// Log receives the invalidator's and the cache-node's logs; nil writes
	// them to Dir/logs/invalidator.log and Dir/logs/cache-node.log.
	Log *slog.Logger
}

// DefaultConfig keeps data in ./.larder-local and uses ports beside, not on,
// the usual ones, so a system PostgreSQL or Redis on the machine is left alone.
func DefaultConfig() Config {
	return Config{
		Dir:                ".larder-local",
		PostgresPort:       15432,
		NATSPort:           14222,
		RedisPort:          16379,
		NATSBin:            "nats-server",
		InvalidatorMetrics: "127.0.0.1:19188",
		CacheNodeMetrics:   "127.0.0.1:19189",
		FrontPort:          16432,
		FrontMetrics:       "127.0.0.1:19187", // below the invalidator: the cache-nodes take 19189 and up
		CacheNodePort:      17070,
		CacheNodeMemory:    256 << 20,
	}
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("local: Dir is required")
	}
	for _, p := range []int{c.PostgresPort, c.NATSPort, c.RedisPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("local: bad port %d", p)
		}
	}
	return nil
}

// Stack is the running local stack: PostgreSQL, NATS with JetStream, Redis
// and the invalidator (with its pincushion) on the "postgres" database.
// Later components (cache-nodes, the RUBiS app) join it.
type Stack struct {
	PG    *servers.Postgres
	NATS  *servers.NATS
	Redis *servers.Redis
	dir   string
	// front is the PostgreSQL wire front (nil: none).
	front *stackFront
	// appQUMA is the application's QUMA file (Config.InvalidatorQUMA), absolute.
	appQUMA string
	// Creds are the credentials the stack generated at start: every
	// component authenticates with its own.
	Creds Credentials

	stopInvalidator context.CancelFunc
	invalidatorDone chan error
	metricsAddr     string

	nodes      []*stackNode // the cache-nodes, the home node first (nodes.go)
	standalone []*stackNode // Config.StandaloneCacheNodes

	// identityProblem is the invalidator's replica identity complaint
	// while it waits for the fix ("" when it runs).
	problemMu       sync.Mutex
	identityProblem string
	logFiles        []*os.File

	closeOnce sync.Once
	closeErr  error
}

// Start brings the stack up; on error, whatever started is stopped again.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	s := &Stack{dir: dir}
	if cfg.InvalidatorQUMA != "" {
		if s.appQUMA, err = filepath.Abs(cfg.InvalidatorQUMA); err != nil {
			return nil, err
		}
		if _, err := os.Stat(s.appQUMA); err != nil {
			return nil, fmt.Errorf("local: the QUMA file: %w", err)
		}
	}
	if s.Creds, err = newCredentials(filepath.Join(dir, "secrets"), invalidation.DefaultPrefix); err != nil {
		return nil, fmt.Errorf("local: credentials: %w", err)
	}

	pgCfg := servers.DefaultPostgresConfig(filepath.Join(dir, "pg"))
	pgCfg.Port = cfg.PostgresPort
	if len(cfg.PostgresSettings) > 0 {
		pgCfg.Settings = cfg.PostgresSettings
	}
	if s.PG, err = servers.StartPostgres(ctx, pgCfg); err != nil {
		return nil, fmt.Errorf("local: PostgreSQL: %w", err)
	}
	natsCfg := servers.DefaultNATSConfig(filepath.Join(dir, "nats"))
	natsCfg.Port, natsCfg.Bin, natsCfg.Users = cfg.NATSPort, cfg.NATSBin, s.Creds.NATS.Users
	if s.NATS, err = servers.StartNATS(ctx, natsCfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: NATS: %w", err)
	}
	redisCfg := servers.DefaultRedisConfig(filepath.Join(dir, "redis"))
	redisCfg.Port, redisCfg.Persist = cfg.RedisPort, true
	if s.Redis, err = servers.StartRedis(ctx, redisCfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: Redis: %w", err)
	}
	if err := s.startInvalidator(cfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: invalidator: %w", err)
	}
	if err := s.startCacheNodes(cfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: cache-node: %w", err)
	}
	if err := s.writeQUMA(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: QUMA file: %w", err)
	}
	if err := s.startFront(ctx, cfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: PostgreSQL wire front: %w", err)
	}
	if err := os.WriteFile(s.EnvFile(), []byte(s.envText()), 0o600); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: %w", err)
	}
	return s, nil
}

// startInvalidator runs the invalidator in this process. A configuration
// error (say, a table without a replica identity) stops the start.
func (s *Stack) startInvalidator(cfg Config) error {
	o := service.Defaults()
	o.PG, o.NATS = s.PG.URL("postgres"), s.NATS.URL()
	var err error
	if o.NATSOptions, err = s.Creds.natsOptions(invalidation.RoleInvalidator); err != nil {
		return err
	}
	o.QUMA = cfg.InvalidatorQUMA
	o.FixIdentity = cfg.FixReplicaIdentity
	if cfg.PinMaxAge > 0 {
		o.MaxStaleness = cfg.PinMaxAge
	}
	log, err := s.logger(cfg, "invalidator.log")
	if err != nil {
		return err
	}
	// The metrics port stays bound from when it is picked ("host:0") to
	// when the invalidator serves on it; a restart listens on it again.
	if o.MetricsListener, err = listenMetrics(cfg.InvalidatorMetrics); err != nil {
		return err
	}
	if o.MetricsListener != nil {
		s.metricsAddr = o.MetricsListener.Addr().String()
	}
	o.Metrics = s.metricsAddr
	ctx, cancel := context.WithCancel(context.Background())
	s.stopInvalidator = cancel
	s.invalidatorDone = make(chan error, 1)
	// A table whose replica identity lacks its tag columns stops the
	// invalidator; here it waits for the fix, run through PostgreSQL,
	// which stays up, and starts again every few seconds.
	go func() {
		for {
			run := make(chan error, 1)
			go func(o service.Options) { run <- service.Run(ctx, o, log) }(o)
			o.MetricsListener = nil
			var err error
			select {
			case err = <-run:
			case <-time.After(5 * time.Second):
				// Past its start-up checks: no complaint stands.
				s.problemMu.Lock()
				s.identityProblem = ""
				s.problemMu.Unlock()
				err = <-run
			}
			var ie *publisher.IdentityError
			if ctx.Err() != nil || !errors.As(err, &ie) {
				s.invalidatorDone <- err
				return
			}
			s.problemMu.Lock()
			s.identityProblem = ie.Error()
			s.problemMu.Unlock()
			log.Error("waiting for the replica identity fix; retrying in 3s", "err", ie)
			select {
			case <-ctx.Done():
				s.invalidatorDone <- nil
				return
			case <-time.After(3 * time.Second):
			}
		}
	}()
	// A configuration error shows at once; otherwise it is running.
	select {
	case err := <-s.invalidatorDone:
		s.invalidatorDone <- err
		if err != nil && service.IsConfig(err) {
			return err
		}
	case <-time.After(500 * time.Millisecond):
	}
	return nil
}

// IdentityProblem is the invalidator's replica identity complaint, with
// the ALTER TABLE statements that fix it, while it waits for them ("" once
// it runs).
func (s *Stack) IdentityProblem() string {
	s.problemMu.Lock()
	defer s.problemMu.Unlock()
	return s.identityProblem
}

// listenMetrics listens on a /metrics address ("host:0" picks a free
// port; "" is none: nil). The listener goes to the server itself: a port
// picked, closed and listened on again could be taken in between.
func listenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("local: metrics listener: %w", err)
	}
	return ln, nil
}

// logger is cfg.Log, or a logger writing to Dir/logs/name.
func (s *Stack) logger(cfg Config, name string) (*slog.Logger, error) {
	if cfg.Log != nil {
		return cfg.Log, nil
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, "logs", name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	s.logFiles = append(s.logFiles, f)
	return slog.New(slog.NewTextHandler(f, nil)), nil
}

// LogDir is where the invalidator's and the cache-node's logs go (unless
// Config.Log).
func (s *Stack) LogDir() string { return filepath.Join(s.dir, "logs") }

// writeQUMA analyzes the database's schema from its catalogs (no workload
// yet: every query is table-tagged) into the QUMA file client-lib loads.
func (s *Stack) writeQUMA(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.PG.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, demoTableDDL); err != nil {
		return err
	}
	schema, err := quma.LoadCatalog(ctx, conn)
	if err != nil {
		return err
	}
	sol, err := quma.AnalyzeWorkload(schema, nil)
	if err != nil {
		return err
	}
	f, err := os.Create(s.QUMAFile())
	if err != nil {
		return err
	}
	if err := sol.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// QUMAFile is the stack's QUMA file.
func (s *Stack) QUMAFile() string { return filepath.Join(s.dir, "quma.json") }

// DSN is a ready database/sql DSN for the larder driver.
func (s *Stack) DSN() string {
	q := url.Values{}
	q.Set("larder.nats", s.NATS.URL())
	q.Set("larder.nats-nkey", s.Creds.NATS.Seeds[invalidation.RoleClient])
	q.Set("larder.nodes", strings.Join(s.CacheNodeAddrs(), ","))
	if len(s.nodes) > 1 {
		q.Set("larder.node-placement", "home")
	}
	q.Set("larder.node-ca", s.Creds.CA)
	q.Set("larder.node-cert", s.Creds.ClientCert)
	q.Set("larder.node-key", s.Creds.ClientKey)
	q.Set("larder.quma", s.qumaForClients())
	return s.PG.URL("postgres") + "&" + q.Encode()
}

// qumaForClients is the QUMA file LARDER_DSN names: the application's
// (Config.InvalidatorQUMA), else the one the stack wrote.
func (s *Stack) qumaForClients() string {
	if s.appQUMA != "" {
		return s.appQUMA
	}
	return s.QUMAFile()
}

// CacheNodeAddr is where the (first) cache-node serves its protocol.
func (s *Stack) CacheNodeAddr() string {
	if len(s.nodes) == 0 {
		return ""
	}
	return s.nodes[0].addr
}

// InvalidatorMetricsURL is the invalidator's Prometheus endpoint, if any.
func (s *Stack) InvalidatorMetricsURL() string {
	if s.metricsAddr == "" {
		return ""
	}
	return "http://" + s.metricsAddr + "/metrics"
}

// URLs are the stack's endpoints, by environment variable name.
func (s *Stack) URLs() map[string]string {
	m := map[string]string{
		"LARDER_PG_URL":    s.PG.URL("postgres"),
		"LARDER_NATS_URL":  s.NATS.URL(),
		"LARDER_REDIS_URL": s.redisNodeURL(),
	}
	m["LARDER_NATS_NKEY"] = s.Creds.NATS.Seeds[invalidation.RoleClient]
	m["LARDER_NODE_CA"] = s.Creds.CA
	m["LARDER_NODE_CERT"] = s.Creds.ClientCert
	m["LARDER_NODE_KEY"] = s.Creds.ClientKey
	if len(s.nodes) > 0 {
		m["LARDER_CACHE_NODE"] = s.nodes[0].addr
		m["LARDER_DSN"] = s.DSN()
	}
	if len(s.nodes) > 1 {
		m["LARDER_CACHE_NODES"] = strings.Join(s.CacheNodeAddrs(), ",")
		if metrics := metricsURLs(s.nodes); metrics != "" {
			m["LARDER_CACHE_NODES_METRICS"] = metrics
		}
	}
	if len(s.standalone) > 0 {
		m["LARDER_STANDALONE_NODES"] = strings.Join(s.StandaloneNodeAddrs(), ",")
		if metrics := metricsURLs(s.standalone); metrics != "" {
			m["LARDER_STANDALONE_NODES_METRICS"] = metrics
		}
	}
	if u := s.InvalidatorMetricsURL(); u != "" {
		m["LARDER_INVALIDATOR_METRICS"] = u
	}
	if u := s.ProxyURL(); u != "" {
		m["LARDER_PROXY_URL"] = u
		if s.front.metricsAddr != "" {
			m["LARDER_PROXY_METRICS"] = "http://" + s.front.metricsAddr + "/metrics"
		}
	}
	if len(s.nodes) > 0 && s.nodes[0].metricsAddr != "" {
		m["LARDER_CACHE_NODE_METRICS"] = "http://" + s.nodes[0].metricsAddr + "/metrics"
	}
	return m
}

// redisNodeURL is the Redis URL of the cache-node's least-privilege ACL
// user (servers.RedisCacheNodeACL: no CONFIG, only the store's keys).
func (s *Stack) redisNodeURL() string {
	u, err := s.Redis.URLFor(servers.RedisCacheNodeUser)
	if err != nil {
		return s.Redis.URL()
	}
	return u
}

// EnvFile is where the stack writes its URLs for other tools to source.
func (s *Stack) EnvFile() string { return filepath.Join(s.dir, "stack.env") }

func (s *Stack) envText() string {
	urls := s.URLs()
	keys := make([]string, 0, len(urls))
	for k := range urls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		// Single-quoted, so that `source stack.env` keeps the DSN's '&'.
		fmt.Fprintf(&b, "%s='%s'\n", k, strings.ReplaceAll(urls[k], "'", `'\''`))
	}
	return b.String()
}

// Close stops every server, in reverse start order. Idempotent.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if err := s.front.stop(); err != nil {
			errs = append(errs, fmt.Errorf("front: %w", err))
		}
		errs = append(errs, s.stopCacheNodes()...)
		if s.stopInvalidator != nil {
			s.stopInvalidator()
			if err := <-s.invalidatorDone; err != nil {
				errs = append(errs, fmt.Errorf("invalidator: %w", err))
			}
		}
		if s.Redis != nil {
			errs = append(errs, s.Redis.Close())
		}
		if s.NATS != nil {
			errs = append(errs, s.NATS.Close())
		}
		if s.PG != nil {
			errs = append(errs, s.PG.Close())
		}
		_ = os.Remove(s.EnvFile())
		for _, f := range s.logFiles {
			_ = f.Close()
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
