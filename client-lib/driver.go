package larder

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// DriverName is the database/sql driver this package registers.
const DriverName = "larder"

var registered driver.Driver = &Driver{}

func init() { sql.Register(DriverName, registered) }

// Driver is the database/sql driver. Its DSN is a PostgreSQL URL whose
// larder.* query parameters configure the cache: larder.nats (NATS URL),
// larder.nodes (comma-separated cache-node addresses), larder.quma (the
// QUMA file), larder.staleness (a Go duration), larder.l1 (L1 bytes),
// larder.prefix (NATS subject prefix); larder.ignore-consistency=true is the
// benchmarks' ablation and nothing else. A read-only transaction
// (sql.TxOptions{ReadOnly: true}) is a cached read-only transaction;
// everything else is plain PostgreSQL through pgx.
type Driver struct {
	mu      sync.Mutex
	clients map[string]*Client
}

// Open implements driver.Driver.
func (d *Driver) Open(dsn string) (driver.Conn, error) {
	c, err := d.OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	return c.Connect(context.Background())
}

// OpenConnector implements driver.DriverContext.
func (d *Driver) OpenConnector(dsn string) (driver.Connector, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	pgcfg, err := pgx.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	return &connector{d: d, dsn: dsn, cfg: cfg, pg: stdlib.GetConnector(*pgcfg)}, nil
}

// ParseDSN splits a DSN into the client configuration (PostgresURL holds
// the URL without the larder.* parameters).
func ParseDSN(dsn string) (Config, error) {
	var cfg Config
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return cfg, fmt.Errorf("larder: the DSN must be a postgres:// URL with larder.* parameters")
	}
	q := u.Query()
	for k, vs := range q {
		if !strings.HasPrefix(k, "larder.") {
			continue
		}
		v := vs[len(vs)-1]
		switch k {
		case "larder.nats":
			cfg.NATSURL = v
		case "larder.nodes":
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					cfg.Nodes = append(cfg.Nodes, n)
				}
			}
		case "larder.quma":
			cfg.QUMA = v
		case "larder.prefix":
			cfg.Prefix = v
		case "larder.ignore-consistency":
			// the benchmarks' "no consistency" ablation; never in production
			cfg.IgnoreConsistency = v == "true"
		case "larder.staleness":
			if cfg.Staleness, err = time.ParseDuration(v); err != nil || cfg.Staleness <= 0 {
				return cfg, fmt.Errorf("larder: larder.staleness=%q: want a positive duration such as 30s", v)
			}
		case "larder.l1":
			if cfg.L1Bytes, err = strconv.ParseInt(v, 10, 64); err != nil || cfg.L1Bytes < 0 {
				return cfg, fmt.Errorf("larder: larder.l1=%q: want a byte count", v)
			}
		default:
			return cfg, fmt.Errorf("larder: unknown DSN parameter %s", k)
		}
		q.Del(k)
	}
	if cfg.NATSURL == "" || cfg.QUMA == "" {
		return cfg, errors.New("larder: the DSN needs larder.nats and larder.quma")
	}
	u.RawQuery = q.Encode()
	cfg.PostgresURL = u.String()
	return cfg, nil
}

type connector struct {
	d   *Driver
	dsn string
	cfg Config
	pg  driver.Connector
}

func (c *connector) Driver() driver.Driver { return c.d }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	cl, err := c.d.client(ctx, c.dsn, c.cfg)
	if err != nil {
		return nil, err
	}
	pc, err := c.pg.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: pc.(*stdlib.Conn), c: cl}, nil
}

// client returns the DSN's Client, shared by every connection of it.
func (d *Driver) client(ctx context.Context, dsn string, cfg Config) (*Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cl := d.clients[dsn]; cl != nil {
		return cl, nil
	}
	cl, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if d.clients == nil {
		d.clients = map[string]*Client{}
	}
	d.clients[dsn] = cl
	return cl, nil
}

// DriverStats returns the counters of the Client behind a DSN opened with
// the larder driver, if it was opened in this process.
func DriverStats(dsn string) (*Stats, bool) {
	d, ok := registered.(*Driver)
	if !ok {
		return nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.clients[dsn]
	if c == nil {
		return nil, false
	}
	return c.Stats(), true
}

type stalenessKey struct{}

// WithStaleness sets the staleness limit of the read-only transaction
// begun with ctx (database/sql's BeginTx).
func WithStaleness(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, stalenessKey{}, d)
}

// conn is a pgx database/sql connection whose read-only transactions go
// through the cache.
type conn struct {
	*stdlib.Conn
	c    *Client
	ro   *ROTx
	inRW bool // a read/write transaction is open
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if !opts.ReadOnly {
		tx, err := c.Conn.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		c.inRW = true
		return &rwTx{Tx: tx, c: c}, nil
	}
	if c.ro != nil {
		return nil, errors.New("larder: a transaction is already open on this connection")
	}
	staleness, _ := ctx.Value(stalenessKey{}).(time.Duration)
	ro, err := c.c.BeginRO(ctx, staleness)
	if err != nil {
		return nil, err
	}
	c.ro = ro
	return roDriverTx{c: c}, nil
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.ro == nil {
		return c.Conn.QueryContext(ctx, query, args)
	}
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	rows, err := c.ro.Query(ctx, query, vals...)
	if err != nil {
		return nil, err
	}
	return &driverRows{r: rows}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.ro != nil {
		return nil, errors.New("larder: a read-only transaction cannot execute statements that write")
	}
	res, err := c.Conn.ExecContext(ctx, query, args)
	if err == nil && !c.inRW {
		// An autocommitted statement: later read-only transactions see it.
		if err := c.noteWritten(ctx); err != nil {
			return nil, err
		}
	}
	return res, err
}

// noteWritten records the WAL position after a commit (read your writes).
func (c *conn) noteWritten(ctx context.Context) error {
	var s string
	if err := c.Conn.Conn().QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return fmt.Errorf("larder: committed, but reading the WAL position failed: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return err
	}
	c.c.sawCommit(uint64(lsn))
	return nil
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.ro != nil {
		return nil, errors.New("larder: prepared statements are not supported in read-only transactions; use QueryContext")
	}
	return c.Conn.PrepareContext(ctx, query)
}

type roDriverTx struct{ c *conn }

func (t roDriverTx) Commit() error   { return t.end() }
func (t roDriverTx) Rollback() error { return t.end() }

func (t roDriverTx) end() error {
	ro := t.c.ro
	t.c.ro = nil
	if ro == nil {
		return nil
	}
	return ro.Commit(context.Background())
}

// rwTx records the commit's WAL position for read-your-writes.
type rwTx struct {
	driver.Tx
	c *conn
}

func (t *rwTx) Commit() error {
	t.c.inRW = false
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	return t.c.noteWritten(context.Background())
}

func (t *rwTx) Rollback() error {
	t.c.inRW = false
	return t.Tx.Rollback()
}

// driverRows adapts Rows to database/sql.
type driverRows struct{ r *Rows }

func (d *driverRows) Columns() []string {
	out := make([]string, len(d.r.res.Fields))
	for i, f := range d.r.res.Fields {
		out[i] = f.Name
	}
	return out
}

func (d *driverRows) Close() error { d.r.Close(); return nil }

func (d *driverRows) Next(dest []driver.Value) error {
	if !d.r.Next() {
		return io.EOF
	}
	vals, err := d.r.Values()
	if err != nil {
		return err
	}
	for i, v := range vals {
		dest[i] = toDriverValue(v)
	}
	return nil
}

func toDriverValue(v any) driver.Value {
	switch x := v.(type) {
	case nil, int64, float64, bool, []byte, string, time.Time:
		return x
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint32:
		return int64(x)
	case float32:
		return float64(x)
	case driver.Valuer:
		if dv, err := x.Value(); err == nil {
			return dv
		}
	}
	return fmt.Sprint(v)
}
