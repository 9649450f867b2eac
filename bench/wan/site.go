package wan

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/invalidator/service"
)

// SiteConfig configures the database's site: PostgreSQL, the hub NATS
// (with the roles' users, accepting leaf nodes) and the invalidator, all
// on loopback.
type SiteConfig struct {
	// Dir holds the servers' data (wiped first) and credentials.
	Dir string
	// Ports (0: free ones).
	PGPort, NATSPort, LeafPort int
	// Size is the RUBiS data loaded (datagen), with seed 1.
	Size datagen.Size
	// Log receives the invalidator's log.
	Log *slog.Logger
}

// Site is a running database site.
type Site struct {
	PG    *servers.Postgres
	NATS  *servers.NATS
	Roles servers.NATSRoles
	// PGURL is the "postgres" database's URL; QUMA RUBiS's QUMA file.
	PGURL, QUMA string
	stop        context.CancelFunc
	done        chan error
}

// StartSite starts PostgreSQL, loads RUBiS, writes its QUMA file, starts
// NATS and the invalidator (publishing RUBiS's tag column sets).
func StartSite(ctx context.Context, cfg SiteConfig) (*Site, error) {
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, err
	}
	// PostgreSQL may run as another user (as root: postgres): the folder
	// must be enterable.
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "secrets"), 0o700); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Site{}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var err error
	pgCfg := servers.DefaultPostgresConfig(filepath.Join(cfg.Dir, "pg"))
	pgCfg.Port = cfg.PGPort
	if s.PG, err = servers.StartPostgres(ctx, pgCfg); err != nil {
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	s.PGURL = s.PG.URL("postgres")
	conn, err := pgx.Connect(ctx, s.PGURL)
	if err != nil {
		return nil, err
	}
	_, err = datagen.Load(ctx, conn, datagen.Config{Size: cfg.Size, Seed: 1})
	conn.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("RUBiS data: %w", err)
	}
	if s.QUMA, err = datagen.WriteQUMA(ctx, s.PGURL, filepath.Join(cfg.Dir, "quma.json")); err != nil {
		return nil, fmt.Errorf("QUMA file: %w", err)
	}
	if s.Roles, err = servers.NewNATSRoles(filepath.Join(cfg.Dir, "secrets"), invalidation.DefaultPrefix); err != nil {
		return nil, err
	}
	leafPort := cfg.LeafPort
	if leafPort == 0 {
		if leafPort, err = servers.FreePort(); err != nil {
			return nil, err
		}
	}
	natsCfg := servers.DefaultNATSConfig(filepath.Join(cfg.Dir, "nats"))
	natsCfg.Port, natsCfg.Users, natsCfg.LeafPort = cfg.NATSPort, s.Roles.Users, leafPort
	if s.NATS, err = servers.StartNATS(ctx, natsCfg); err != nil {
		return nil, fmt.Errorf("NATS: %w", err)
	}
	o := service.Defaults()
	o.PG, o.NATS, o.QUMA, o.Metrics = s.PGURL, s.NATS.URL(), s.QUMA, ""
	opt, err := nats.NkeyOptionFromSeed(s.Roles.Seeds[invalidation.RoleInvalidator])
	if err != nil {
		return nil, err
	}
	o.NATSOptions = []nats.Option{opt}
	ictx, cancel := context.WithCancel(context.Background())
	s.stop, s.done = cancel, make(chan error, 1)
	go func() { s.done <- service.Run(ictx, o, cfg.Log) }()
	// The invalidator is up once its first pin is announced.
	if err := s.waitPin(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// waitPin waits for the pincushion's first pin announcement.
func (s *Site) waitPin(ctx context.Context) error {
	opt, err := nats.NkeyOptionFromSeed(s.Roles.Seeds[invalidation.RoleClient])
	if err != nil {
		return err
	}
	nc, err := nats.Connect(s.NATS.URL(), opt)
	if err != nil {
		return err
	}
	defer nc.Close()
	ch := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(invalidation.PinAnnounceSubject(invalidation.DefaultPrefix), ch)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	select {
	case <-ch:
		return nil
	case err := <-s.done:
		s.done <- err
		return fmt.Errorf("the invalidator stopped: %v", err)
	case <-time.After(90 * time.Second):
		return fmt.Errorf("the invalidator announced no pin in 90 s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Seed is a role's nkey seed file.
func (s *Site) Seed(r invalidation.Role) string { return s.Roles.Seeds[r] }

// HubLeafAddr is where the hub accepts leaf nodes (host:port).
func (s *Site) HubLeafAddr() string {
	return strings.TrimPrefix(s.NATS.LeafURL(), "nats-leaf://")
}

// Close stops the invalidator, NATS and PostgreSQL.
func (s *Site) Close() {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
	if s.NATS != nil {
		_ = s.NATS.Close()
	}
	if s.PG != nil {
		_ = s.PG.Close()
	}
}

// LeafConfig configures an edge site's NATS server, a leaf node of the
// hub.
type LeafConfig struct {
	// HubLeafAddr is the hub's leaf node listener (host:port); the harness
	// puts the link's proxy in front of it.
	HubLeafAddr string
	// Seed is the leaf connection's nkey seed (the hub's RoleLeaf user).
	Seed string
	// Users are the leaf's own users (the edge's cache-node and client
	// roles), NodeSeed the cache-node's seed among them.
	Users    []servers.NATSUser
	NodeSeed string
	// Dir holds the leaf's files.
	Dir string
}

// Leaf is the site's leaf configuration: the edge's users are the hub's
// client and cache-node roles.
func (s *Site) Leaf() *LeafConfig {
	var users []servers.NATSUser
	for i, role := range invalidation.Roles {
		if role == invalidation.RoleClient || role == invalidation.RoleCacheNode {
			users = append(users, s.Roles.Users[i])
		}
	}
	return &LeafConfig{HubLeafAddr: s.HubLeafAddr(), Seed: s.Seed(invalidation.RoleLeaf), Users: users, NodeSeed: s.Seed(invalidation.RoleCacheNode)}
}

// StartLeaf starts the edge's NATS server as a leaf node of the hub and
// waits for its leaf connection.
func StartLeaf(ctx context.Context, cfg LeafConfig) (*servers.NATS, error) {
	nc := servers.DefaultNATSConfig(cfg.Dir)
	nc.Users = cfg.Users
	nc.Leaf = &servers.NATSLeaf{URL: "nats-leaf://" + cfg.HubLeafAddr, Seed: cfg.Seed}
	n, err := servers.StartNATS(ctx, nc)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.WaitLeaf(wctx); err != nil {
		_ = n.Close()
		return nil, err
	}
	return n, nil
}
