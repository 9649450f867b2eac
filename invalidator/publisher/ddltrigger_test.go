package publisher

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Without a superuser the event triggers cannot be installed: the
// publisher refuses to start and names the fix; --ddl-trigger=false
// (NoDDLTrigger) accepts table-level behaviour; once a superuser
// installed them, the user runs with them.
func TestDDLTriggerNeedsSuperuserOnce(t *testing.T) {
	h := newHarness(t, `CREATE TABLE t (id int PRIMARY KEY)`)
	role := "larder_repl_" + h.prefix
	cfg := h.config()
	ctx := context.Background()
	for _, s := range []string{
		"CREATE ROLE " + role + " LOGIN REPLICATION",
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
		"CREATE PUBLICATION " + cfg.Publication + " FOR ALL TABLES",
	} {
		if _, err := h.conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), env.PG.URL("postgres"))
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
			conn.Close(context.Background())
		}
	})
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg.ConnString = u.String()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(ctx)
	var te *DDLTriggerError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "superuser") || !strings.Contains(err.Error(), "--ddl-trigger=false") {
		t.Fatalf("as a non-superuser: %v", err)
	}

	// Installed once by a superuser, used by the non-superuser.
	su := h.config()
	su.Slot = h.slot + "_su"
	sp, err := New(su)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.ensureDDLTrigger(ctx, h.conn); err != nil {
		t.Fatal(err)
	}
	h.start(cfg)
	_, _, txns := h.txnStep("ALTER TABLE t ADD COLUMN v int")
	if got, _ := flushed(txns); strings.Join(got, " ") != "public.t" {
		t.Errorf("flushed %v", got)
	}
}

// Without the event triggers (NoDDLTrigger) the publisher runs and a
// schema change flushes the table at its next row change.
func TestNoDDLTriggerIsTableLevel(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	cfg.NoDDLTrigger = true
	h.start(cfg)
	var n int
	if err := h.conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'larder%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d event triggers installed", n)
	}
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	h.step("ALTER TABLE items ADD COLUMN color text")
	got := describe(h.step("UPDATE items SET color = 'red' WHERE id = 1"))
	if want := "flush:public.items public.items(category)=5:cols=color public.items(id)=1:cols=color public.items:rows"; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}
