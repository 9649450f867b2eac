package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
	"github.com/larderdb/larder/internal/servers"
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
	// InvalidatorQUMA is the application's QUMA file, whose tag column
	// sets the invalidator publishes besides each table's keys ("": keys
	// only).
	InvalidatorQUMA string
	// Log receives the invalidator's and the cache-node's logs; nil
	// discards them.
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
	// Creds are the credentials the stack generated at start: every
	// component authenticates with its own.
	Creds Credentials

	stopInvalidator context.CancelFunc
	invalidatorDone chan error
	metricsAddr     string

	stopNode context.CancelFunc
	nodeDone chan error
	nodeAddr string

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
	if s.Creds, err = newCredentials(filepath.Join(dir, "secrets"), invalidation.DefaultPrefix); err != nil {
		return nil, fmt.Errorf("local: credentials: %w", err)
	}

	pgCfg := servers.DefaultPostgresConfig(filepath.Join(dir, "pg"))
	pgCfg.Port = cfg.PostgresPort
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
	if err := s.startCacheNode(cfg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: cache-node: %w", err)
	}
	if err := s.writeQUMA(ctx); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("local: QUMA file: %w", err)
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
	o.Metrics = ""
	if cfg.InvalidatorMetrics != "" {
		ln, err := net.Listen("tcp", cfg.InvalidatorMetrics)
		if err != nil {
			return err
		}
		s.metricsAddr = ln.Addr().String()
		ln.Close()
		o.Metrics = s.metricsAddr
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopInvalidator = cancel
	s.invalidatorDone = make(chan error, 1)
	go func() { s.invalidatorDone <- service.Run(ctx, o, log) }()
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

// startCacheNode runs a cache-node with the memory backend in this process.
func (s *Stack) startCacheNode(cfg Config) error {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	budget := cfg.CacheNodeMemory
	if budget <= 0 {
		budget = 256 << 20
	}
	o := daemon.Options{Listen: fmt.Sprintf("127.0.0.1:%d", cfg.CacheNodePort), NATS: s.NATS.URL(), Store: "memory", Memory: budget}
	var err error
	if o.TLS, err = pki.ServerTLS(s.Creds.NodeCert, s.Creds.NodeKey, s.Creds.CA); err != nil {
		return err
	}
	if o.NATSOptions, err = s.Creds.natsOptions(invalidation.RoleCacheNode); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	s.stopNode, s.nodeDone = cancel, make(chan error, 1)
	go func() { s.nodeDone <- daemon.Run(ctx, o, log, ready) }()
	select {
	case s.nodeAddr = <-ready:
		return nil
	case err := <-s.nodeDone:
		s.nodeDone <- err
		return err
	}
}

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
	q.Set("larder.nodes", s.nodeAddr)
	q.Set("larder.node-ca", s.Creds.CA)
	q.Set("larder.node-cert", s.Creds.ClientCert)
	q.Set("larder.node-key", s.Creds.ClientKey)
	q.Set("larder.quma", s.QUMAFile())
	return s.PG.URL("postgres") + "&" + q.Encode()
}

// CacheNodeAddr is where the cache-node serves its protocol.
func (s *Stack) CacheNodeAddr() string { return s.nodeAddr }

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
	if s.nodeAddr != "" {
		m["LARDER_CACHE_NODE"] = s.nodeAddr
		m["LARDER_DSN"] = s.DSN()
	}
	if u := s.InvalidatorMetricsURL(); u != "" {
		m["LARDER_INVALIDATOR_METRICS"] = u
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
		if s.stopNode != nil {
			s.stopNode()
			if err := <-s.nodeDone; err != nil {
				errs = append(errs, fmt.Errorf("cache-node: %w", err))
			}
		}
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
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
