package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// slotWatch remembers the last wal_status read, so that a change is
// logged once.
type slotWatch struct {
	mu     sync.Mutex
	status string
}

// WatchSlot reads the replication slot's statistics every
// Config.SlotWatch until ctx ends, on a connection of its own: the WAL the
// slot retains and its wal_status are exported also while no replication
// session runs (NATS unreachable, sessions failing). A slot whose
// wal_status becomes "unreserved" (past max_slot_wal_keep_size: the WAL
// it needs goes at the next checkpoint) is logged as a warning; "lost" (invalidated) as an error: the next
// session drops it, creates it again and flushes every table.
func (p *Publisher) WatchSlot(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(p.cfg.SlotWatch)
	defer t.Stop()
	for {
		if conn == nil {
			c, err := pgx.Connect(ctx, p.cfg.ConnString)
			if err == nil {
				conn = c
			} else if ctx.Err() == nil {
				p.cfg.Log.Debug("slot statistics: connect", "err", err)
			}
		}
		if conn != nil && !p.slotStats(ctx, conn) {
			conn.Close(context.Background())
			conn = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// slotStats updates the slot's metrics (WAL it retains, wal_status, WAL
// that can still be written before it is in danger) and logs a change of
// its wal_status to unreserved or lost. It returns false when the
// connection failed.
func (p *Publisher) slotStats(ctx context.Context, conn *pgx.Conn) bool {
	var status *string
	var retained, safe *float64
	err := conn.QueryRow(ctx, `SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8, safe_wal_size::float8
FROM pg_replication_slots WHERE slot_name = $1`, p.cfg.Slot).Scan(&status, &retained, &safe)
	if errors.Is(err, pgx.ErrNoRows) {
		return true // not created yet, or dropped to be created again
	}
	if err != nil {
		if ctx.Err() == nil {
			p.cfg.Log.Warn("read the slot's statistics", "slot", p.cfg.Slot, "err", err)
		}
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) // a server error leaves the connection usable
	}
	st := "unknown"
	if status != nil {
		st = *status
	}
	for _, s := range slotStatuses {
		v := 0.0
		if s == st {
			v = 1
		}
		p.m.slotStatus.WithLabelValues(s).Set(v)
	}
	if retained != nil {
		p.m.slotRetained.Set(*retained)
	}
	if safe != nil {
		p.m.slotSafe.Set(*safe)
	} else {
		p.m.slotSafe.Set(-1)
	}

	p.watch.mu.Lock()
	changed := st != p.watch.status
	p.watch.status = st
	p.watch.mu.Unlock()
	if !changed {
		return true
	}
	mb := func(f *float64) string {
		if f == nil {
			return "unknown"
		}
		return fmt.Sprintf("%.1f MB", *f/(1<<20))
	}
	switch st {
	case "unreserved":
		p.cfg.Log.Warn("the replication slot retains more WAL than max_slot_wal_keep_size (the invalidator was stopped or lagging): PostgreSQL removes the WAL it needs at the next checkpoint and invalidates it; an invalidated slot is created again and every table flushed",
			"slot", p.cfg.Slot, "wal_status", st, "retained", mb(retained), "safe_wal_size", mb(safe))
	case "lost":
		p.cfg.Log.Error("the replication slot was invalidated (wal_status lost: it exceeded max_slot_wal_keep_size); the next replication session drops it, creates it again and flushes every table",
			"slot", p.cfg.Slot, "retained", mb(retained))
	default:
		p.cfg.Log.Debug("replication slot", "slot", p.cfg.Slot, "wal_status", st, "retained", mb(retained), "safe_wal_size", mb(safe))
	}
	return true
}
