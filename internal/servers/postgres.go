package servers

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresConfig configures a PostgreSQL server started by StartPostgres.
type PostgresConfig struct {
	// Dir holds the cluster (Dir/data), its socket and its log. It is created
	// if missing; an existing cluster in it is reused, so data survives restarts.
	Dir string
	// Port to listen on, on 127.0.0.1; 0 picks a free one.
	Port int
	// BinDir holds initdb and postgres; empty searches LARDER_PG_BINDIR, then
	// /usr/lib/postgresql/{17,16,15}/bin, then $PATH.
	BinDir string
	// RunAs is the OS user the server runs as when the caller is root
	// (PostgreSQL refuses root). Debian's postgresql-15 package creates "postgres".
	RunAs string
	// Settings are extra postgresql.conf settings passed with -c; they override the defaults.
	Settings map[string]string
	// StartTimeout bounds initdb plus start-up.
	StartTimeout time.Duration
}

// DefaultPostgresSettings are the server settings every Larder PostgreSQL runs with.
func DefaultPostgresSettings() map[string]string {
	return map[string]string{
		"wal_level":             "logical", // the invalidator decodes the WAL
		"max_replication_slots": "32",      // one per invalidator plus tests that make their own
		"max_wal_senders":       "32",
		"max_connections":       "300", // the pincushion holds up to 32 pinned snapshots open per instance
		"fsync":                 "off", // throwaway and local clusters: speed over crash safety
		"full_page_writes":      "off",
		"synchronous_commit":    "on", // commit LSNs are the product's clock; keep commits ordinary
		"listen_addresses":      "127.0.0.1",
		"log_min_messages":      "warning",
		"logging_collector":     "off",
		"shared_buffers":        "128MB",
	}
}

// DefaultPostgresConfig returns a config for a server in dir on a free port.
func DefaultPostgresConfig(dir string) PostgresConfig {
	return PostgresConfig{
		Dir:          dir,
		RunAs:        "postgres", // created by Debian's postgresql-15 package
		StartTimeout: 60 * time.Second,
	}
}

// Validate reports a config that cannot work.
func (c PostgresConfig) Validate() error {
	if c.Dir == "" {
		return errors.New("larder/servers: postgres: Dir is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("larder/servers: postgres: bad port %d", c.Port)
	}
	if c.StartTimeout <= 0 {
		return errors.New("larder/servers: postgres: StartTimeout must be positive")
	}
	return nil
}

// Postgres is a running PostgreSQL server. Safe for concurrent use.
type Postgres struct {
	cfg     PostgresConfig
	port    int
	dataDir string
	sockDir string
	proc    *process
}

// pgBinDirs lists where PostgreSQL server binaries are looked for, newest first.
func pgBinDirs(cfg PostgresConfig) []string {
	var dirs []string
	if cfg.BinDir != "" {
		return []string{cfg.BinDir}
	}
	if d := os.Getenv("LARDER_PG_BINDIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, v := range []string{"17", "16", "15"} {
		dirs = append(dirs, "/usr/lib/postgresql/"+v+"/bin")
	}
	return dirs
}

const pgInstallHint = "apt-get install postgresql-15 (or run `make deps`)"

// StartPostgres initializes the cluster in cfg.Dir if needed and starts it,
// returning once it accepts connections.
func StartPostgres(ctx context.Context, cfg PostgresConfig) (*Postgres, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dirs := pgBinDirs(cfg)
	initdb, err := lookPath("initdb", dirs, cfg.BinDir == "", pgInstallHint)
	if err != nil {
		return nil, err
	}
	postgres, err := lookPath("postgres", []string{filepath.Dir(initdb)}, false, pgInstallHint)
	if err != nil {
		return nil, err
	}
	as, err := unprivilegedUser(cfg.RunAs)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()

	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("larder/servers: postgres dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("larder/servers: postgres dir: %w", err)
	}
	if as != nil {
		if err := checkReachable(dir, as); err != nil {
			return nil, err
		}
	}
	p := &Postgres{cfg: cfg, dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "sock")}
	if err := os.MkdirAll(p.sockDir, 0o755); err != nil {
		return nil, fmt.Errorf("larder/servers: postgres socket dir: %w", err)
	}
	if err := chownTree(p.sockDir, as); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(p.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(p.dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("larder/servers: postgres data dir: %w", err)
		}
		if err := chownTree(p.dataDir, as); err != nil {
			return nil, err
		}
		if err := runAs(ctx, as, initdb, "-D", p.dataDir, "-U", "postgres", "--auth=trust",
			"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
			return nil, err
		}
	}

	settings := DefaultPostgresSettings()
	for k, v := range cfg.Settings {
		settings[k] = v
	}
	settings["unix_socket_directories"] = p.sockDir
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	logPath := filepath.Join(dir, "postgres.log")
	const attempts = 3 // a free port can be taken between FreePort and bind
	for attempt := 1; ; attempt++ {
		p.port = cfg.Port
		if p.port == 0 {
			if p.port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		args := []string{"-D", p.dataDir, "-p", strconv.Itoa(p.port)}
		for _, k := range keys {
			args = append(args, "-c", k+"="+settings[k])
		}
		p.proc, err = startProcess("postgres", postgres, args, logPath, as, syscall.SIGINT)
		if err != nil {
			return nil, err
		}
		err = waitReady(ctx, p.proc, p.ping)
		if err == nil {
			return p, nil
		}
		_ = p.proc.stop()
		if cfg.Port != 0 || attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
	}
}

// checkReachable fails early, with a clear message, when the unprivileged
// user cannot traverse to dir (a data dir under /root, say).
func checkReachable(dir string, as *osUser) error {
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("larder/servers: %w", err)
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if d == dir || !ok {
			continue
		}
		mode := st.Mode().Perm()
		canX := mode&0o001 != 0 || (sys.Uid == as.uid && mode&0o100 != 0) || (sys.Gid == as.gid && mode&0o010 != 0)
		if !canX {
			return fmt.Errorf("larder/servers: PostgreSQL runs as OS user %q, which cannot enter %s (mode %v): choose a directory outside it, or chmod o+x it", as.name, d, mode)
		}
	}
	return nil
}

func (p *Postgres) ping(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// Port is the TCP port the server listens on (127.0.0.1).
func (p *Postgres) Port() int { return p.port }

// DataDir is the cluster's data directory.
func (p *Postgres) DataDir() string { return p.dataDir }

// LogPath is the server log file.
func (p *Postgres) LogPath() string { return p.proc.logPath }

// URL is a connection URL for database db as the superuser "postgres".
func (p *Postgres) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: "127.0.0.1:" + strconv.Itoa(p.port),
		Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// ReplicationURL is URL(db) for a logical replication connection.
func (p *Postgres) ReplicationURL(db string) string { return p.URL(db) + "&replication=database" }

// CreateDatabase creates a fresh database and returns its URL.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("larder/servers: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("larder/servers: create database %s: %w", name, err)
	}
	return p.URL(name), nil
}

// Close shuts the server down (fast shutdown) and waits for it. Idempotent.
func (p *Postgres) Close() error {
	if err := p.proc.stop(); err != nil {
		return err
	}
	// A clean shutdown removes postmaster.pid (pg_ctl checks the same).
	if _, err := os.Stat(filepath.Join(p.dataDir, "postmaster.pid")); err == nil {
		return fmt.Errorf("larder/servers: postgres did not shut down cleanly; log:\n%s", p.proc.logTail())
	}
	return nil
}

// DropDatabase drops a database, disconnecting its sessions first.
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("larder/servers: connect: %w", err)
	}
	defer conn.Close(context.Background())
	// Logical replication slots pin a database: end their sessions and drop them first.
	const dropSlots = `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`
	for i := 0; ; i++ {
		if _, err := conn.Exec(ctx, dropSlots, name); err != nil {
			return fmt.Errorf("larder/servers: drop database %s: end slot sessions: %w", name, err)
		}
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if err == nil {
			break
		}
		if i == 50 || ctx.Err() != nil {
			return fmt.Errorf("larder/servers: drop database %s: drop slots: %w", name, err)
		}
		time.Sleep(100 * time.Millisecond) // a terminated walsender releases its slot asynchronously
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("larder/servers: drop database %s: %w", name, err)
	}
	return nil
}
