package larder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/larderdb/larder/internal/invalidation"
)

// Pin names a pinned snapshot: the snapshot the pincushion exported and
// holds open, its exact commit-LSN timestamp, and the start time of the
// PostgreSQL server that exported it (zero: unknown). Snapshot ids repeat
// across server restarts: a pin is imported only on a connection to a
// server that started at ServerStart.
type Pin struct {
	SnapshotID  string
	LSN         uint64
	ServerStart time.Time
}

// LoadRequest is what a Loader needs to begin a transaction's PostgreSQL
// part at its pin.
type LoadRequest struct {
	Pin    Pin
	Tables []string // to hold (and check the storage of) from the start
	// SQLFormats: results in the formats database/sql's driver asks for.
	SQLFormats bool
	// Scope is the key of the session scope the transaction's results are
	// cached under: a Loader that would read as another role or with
	// other settings refuses (ErrLoaderUnavailable).
	Scope string
	// Session: the transaction is a database/sql connection's (its
	// settings live on that connection). The Loader runs it only in
	// Scope, and refuses statements that may change the session's state
	// (they would change the Loader's session, not the connection's).
	Session bool
	// SearchPath is the session's resolved search path, for the
	// analyzer that tells such statements apart.
	SearchPath []string
}

// Loader is the seam between a read-only transaction and where its misses
// run: it begins the transaction's PostgreSQL part at a pin. The
// transaction logic (candidates, hits, validity, retries) does not know
// which Loader it has.
//
// The default is the direct path: the client's own PostgreSQL connection
// (ROTx.begin, which the transaction also uses for fresh snapshots and
// for database/sql sessions). Config.Origin sets an origin's Loader up:
// the misses then run next to PostgreSQL and travel back as row recipes.
// Client.DirectLoader is the direct path as a Loader, which an origin
// serves edges with.
//
// Implementations are safe for concurrent use; a PinnedTx is used by one
// goroutine.
type Loader interface {
	// BeginAt imports the pin's snapshot, holds req.Tables and checks
	// their storage, as the direct path does. Errors: PostgreSQL's for a
	// released snapshot (SQLSTATE 22023, 55000; also 22023 for a pin
	// whose server start is not the connection's), one wrapping ErrRetry
	// when a table was rewritten after the pin, one wrapping
	// ErrLoaderUnavailable when the Loader cannot take the transaction
	// (the client then begins on its own connection at the same pin).
	BeginAt(ctx context.Context, req LoadRequest) (PinnedTx, error)
}

// PinnedTx is a transaction a Loader began at a pin.
type PinnedTx interface {
	// Hold holds more tables, as BeginAt does.
	Hold(ctx context.Context, tables []string) error
	// Query runs a statement at the pin. A schema change that replaced a
	// result type is answered by running it again at the same pin, or
	// ErrRetry.
	Query(ctx context.Context, sql string, args []any) (*Result, error)
	// End ends the transaction (read-only: nothing to keep).
	End(ctx context.Context) error
}

// ErrLoaderUnavailable: a Loader cannot take a transaction now (an origin
// that is unreachable, busy, or reads in another scope). The transaction
// begins on the client's own connection instead, at the same pin.
var ErrLoaderUnavailable = errors.New("larder: the loader cannot take the transaction")

// beginAt begins the transaction's PostgreSQL part at pin: through the
// client's Loader when it has one, else on a connection (begin). A
// database/sql session's transaction goes through the Loader too when the
// Loader reads in the session's scope (same role and settings: the
// Loader compares the scope's key); otherwise it begins on the session's
// own connection.
func (t *ROTx) beginAt(ctx context.Context, pin invalidation.Pin, tables []string) error {
	if t.c.loader == nil || (t.session != nil && t.scope.key == "") {
		return t.begin(ctx, pin, tables)
	}
	tx, err := t.c.loader.BeginAt(ctx, LoadRequest{Pin: Pin{SnapshotID: pin.SnapshotID, LSN: pin.LSN, ServerStart: pin.ServerStart}, Tables: tables, SQLFormats: t.sqlFormats,
		Scope: t.scope.key, Session: t.session != nil, SearchPath: t.scope.path})
	if err == nil {
		t.remote = tx
		return nil
	}
	if !errors.Is(err, ErrLoaderUnavailable) || ctx.Err() != nil {
		return err
	}
	t.c.lm.noteFallback()
	return t.begin(ctx, pin, tables)
}

// DirectLoader returns the direct path as a Loader: transactions on the
// client's own PostgreSQL connections, with the same snapshot import,
// table holds, storage checks and replans as a read-only transaction's.
// An origin serves edges with it.
func (c *Client) DirectLoader() Loader { return directLoader{c} }

type directLoader struct{ c *Client }

func (l directLoader) BeginAt(ctx context.Context, req LoadRequest) (PinnedTx, error) {
	c := l.c
	scope := *c.poolScope.Load()
	if req.Scope != "" && req.Scope != scope.key {
		return nil, fmt.Errorf("%w: the requester's session scope is not this client's", ErrLoaderUnavailable)
	}
	// An edge's statements are its own (tainted: the transaction does not
	// park when it ends).
	t := &ROTx{c: c, m: c.maps.Get().(*pgxTypeMap), scope: scope, sqlFormats: req.SQLFormats, begun: time.Now(), tainted: true}
	pin := invalidation.Pin{SnapshotID: req.Pin.SnapshotID, LSN: req.Pin.LSN, ServerStart: req.Pin.ServerStart}
	if err := t.begin(ctx, pin, req.Tables); err != nil {
		t.release()
		return nil, err
	}
	t.fixed, t.ts, t.pin = true, pin.LSN, pin
	t.cands = []invalidation.Pin{pin}
	return directTx{t}, nil
}

// directTx is a read-only transaction fixed at its pin from the start.
type directTx struct{ t *ROTx }

func (d directTx) Hold(ctx context.Context, tables []string) error {
	return d.t.holdTables(ctx, tables)
}

func (d directTx) Query(ctx context.Context, sql string, args []any) (*Result, error) {
	return d.t.atSnapshot(ctx, sql, args, nil)
}

func (d directTx) End(ctx context.Context) error { return d.t.finish(ctx) }
