package larder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/origin"
	"github.com/larderdb/larder/internal/recipe"
)

// OpenPinned opens a client that runs transactions only at pins it is
// given (DirectLoader, OriginBackend): an origin's. It needs PostgreSQL
// only: no NATS, QUMA file or cache-nodes, since it neither chooses
// snapshots nor caches. It reads with the session scope of postgresURL's
// role and settings; an edge whose scope differs is refused.
func OpenPinned(ctx context.Context, postgresURL string, reg prometheus.Registerer) (*Client, error) {
	if postgresURL == "" {
		return nil, errors.New("larder: PostgresURL is required")
	}
	c := &Client{cfg: Config{PostgresURL: postgresURL, Metrics: reg, Log: slog.Default()}, m: newClientMetrics(reg),
		registered: map[string]bool{}, pins: &pinTracker{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.maps.New = func() any { return &pgxTypeMap{pgtype.NewMap()} }
	if err := c.openPool(ctx, postgresURL); err != nil {
		return nil, err
	}
	return c, nil
}

// OriginBackend serves an origin's edges with the client's DirectLoader:
// the same snapshot import, table holds, storage checks and replans as a
// read-only transaction's own.
func (c *Client) OriginBackend() origin.Backend { return originBackend{c.DirectLoader()} }

type originBackend struct{ l Loader }

func (b originBackend) Begin(ctx context.Context, r *origin.Begin) (origin.Tx, error) {
	tx, err := b.l.BeginAt(ctx, LoadRequest{Pin: Pin{SnapshotID: r.Snapshot, LSN: r.TS, ServerStart: r.ServerStart}, Tables: r.Tables, SQLFormats: r.SQLFormats, Scope: r.Scope})
	if err != nil {
		return nil, toOrigin(err)
	}
	return originBackendTx{tx}, nil
}

type originBackendTx struct{ tx PinnedTx }

func (t originBackendTx) Hold(ctx context.Context, tables []string) error {
	return toOrigin(t.tx.Hold(ctx, tables))
}

func (t originBackendTx) Query(ctx context.Context, sql string, args []any) (recipe.Result, error) {
	res, err := t.tx.Query(ctx, sql, args)
	if err != nil {
		return recipe.Result{}, toOrigin(err)
	}
	return res.recipeResult(), nil
}

func (t originBackendTx) End(ctx context.Context) error { return t.tx.End(ctx) }

// toOrigin marks the client's retries and refusals with the origin's
// sentinels, which the edge maps back (originError).
func toOrigin(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errRewritten):
		return fmt.Errorf("%v: %w", err, origin.ErrRewritten)
	case errors.Is(err, ErrRetry):
		return fmt.Errorf("%v: %w", err, origin.ErrRetry)
	case errors.Is(err, ErrLoaderUnavailable):
		return fmt.Errorf("%v: %w", err, origin.ErrScope)
	}
	return err
}

// PoolSized returns postgresURL with its pool bounded at n connections
// (pgxpool's pool_max_conns) unless the URL sets it. An origin holds a
// connection per open edge transaction for the transaction's whole
// length, WAN round trips included: its pool must match its session
// bound, not pgxpool's default (the number of CPUs).
func PoolSized(postgresURL string, n int) string {
	if n <= 0 || strings.Contains(postgresURL, "pool_max_conns") {
		return postgresURL
	}
	u, err := url.Parse(postgresURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// A keyword/value connection string.
		return postgresURL + " pool_max_conns=" + strconv.Itoa(n)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(n))
	u.RawQuery = q.Encode()
	return u.String()
}
