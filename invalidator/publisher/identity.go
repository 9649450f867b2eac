package publisher

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// noteIdentity exports the covered tables whose replica identity is a
// problem (ie nil: none).
func (p *Publisher) noteIdentity(ie *IdentityError) {
	none, partial := 0, 0
	if ie != nil {
		for _, n := range ie.NoIdentity {
			if n {
				none++
			} else {
				partial++
			}
		}
	}
	p.m.identity.WithLabelValues("no_identity").Set(float64(none))
	p.m.identity.WithLabelValues("tag_columns").Set(float64(partial))
}

// identityAfterDDL checks the replica identity of the tables a schema
// change left, and reports each table with a new problem: a table without
// any identity (created without a primary key, say) makes PostgreSQL
// refuse the application's UPDATEs and DELETEs on it while it is
// published; a table whose identity lacks tag columns is flushed by each
// change. With FixReplicaIdentity the fixes are run (on a connection of
// their own: the ALTER TABLE waits for the table's lock).
func (p *Publisher) identityAfterDDL(ctx context.Context, before, after map[string]*tableInfo) {
	ie := checkIdentity(after)
	p.noteIdentity(ie)
	if ie == nil {
		return
	}
	known := map[string]bool{}
	if old := checkIdentity(before); old != nil {
		for i, n := range old.Tables {
			if before[n] != nil && after[n] != nil && before[n].oid == after[n].oid {
				known[n+"\x00"+identityKind(old.NoIdentity[i])] = true
			}
		}
	}
	var fixes []string
	for i, n := range ie.Tables {
		if known[n+"\x00"+identityKind(ie.NoIdentity[i])] {
			continue
		}
		then := "; give it a primary key, or run the fix"
		if p.cfg.FixReplicaIdentity {
			then = "; running the fix (--fix-replica-identity)"
		}
		if ie.NoIdentity[i] {
			p.cfg.Log.Error("a published table has no replica identity: PostgreSQL refuses its UPDATEs and DELETEs"+then,
				"table", n, "fix", ie.Fixes[i], "publication", p.cfg.Publication)
		} else {
			p.cfg.Log.Warn("after a schema change, a table's replica identity lacks tag columns: each change to it flushes it (its old keys are unknown)"+then,
				"why", ie.Why[i], "fix", ie.Fixes[i])
		}
		fixes = append(fixes, ie.Fixes[i])
	}
	if len(fixes) > 0 && p.cfg.FixReplicaIdentity {
		go p.fixIdentityLater(ctx, fixes)
	}
}

func identityKind(none bool) string {
	if none {
		return "none"
	}
	return "partial"
}

// fixIdentityLater runs ALTER TABLE … REPLICA IDENTITY FULL statements on
// a connection of its own.
func (p *Publisher) fixIdentityLater(ctx context.Context, fixes []string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.cfg.ConnString)
	if err != nil {
		p.cfg.Log.Error("fix replica identity: connect", "err", err)
		return
	}
	defer conn.Close(context.Background())
	for _, f := range fixes {
		if _, err := conn.Exec(ctx, f); err != nil {
			p.cfg.Log.Error("fix replica identity", "statement", f, "err", err)
			continue
		}
		p.cfg.Log.Info("replica identity set to FULL", "statement", strings.TrimSuffix(f, ";"))
	}
}
