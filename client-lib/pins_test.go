package larder

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
)

// TestTrackerForgetsReleasedPins: the pincushion holds a budget of pins
// and releases the others (thinned, expired, replaced); a client keeps
// only what the pincushion holds, not every pin announced until it
// expires, and every pin it offers a transaction can be imported.
func TestTrackerForgetsReleasedPins(t *testing.T) {
	values := make([]string, accounts)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, 100)", i+1)
	}
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES "+strings.Join(values, ","),
		readBalance, readBalanceVer, "UPDATE accounts SET balance = balance - $1, ver = ver + 1 WHERE id = $2")
	const budget = 4
	s.invOpts.PinBudget, s.invOpts.PinInterval = budget, 20*time.Millisecond
	s.startInvalidator(t)
	s.startNode(t, "127.0.0.1:0")
	c := s.open(t, s.url, nil, 0)
	ctx := context.Background()

	// Commits between candidates, so that each is a pin of its own; more
	// pins than the budget are announced, most released again.
	var announced int
	for deadline := time.Now().Add(30 * time.Second); announced < 10*budget; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d pins announced", announced)
		}
		if _, err := s.conn.Exec(ctx, "UPDATE accounts SET ver = ver + 1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		announced = int(c.pins.announced.Load())
	}
	// The newest pin may be announced after its list answer, and one
	// release may still be on its way.
	var tracked []invalidation.Pin
	for deadline := time.Now().Add(10 * time.Second); ; {
		tracked = c.pins.candidates(time.Time{}, 0)
		if len(tracked) <= budget+1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(tracked) > budget+1 {
		t.Fatalf("the client tracks %d pins after %d were announced; the pincushion holds at most %d", len(tracked), announced, budget)
	}
	// Every tracked pin but one just released can be imported.
	dead := 0
	for _, pin := range tracked {
		tx, err := s.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+pin.SnapshotID+"'"); err != nil {
			dead++
		}
		_ = tx.Rollback(ctx)
	}
	if dead > 1 {
		t.Fatalf("%d of the %d pins the client tracks were released", dead, len(tracked))
	}
}

// TestPinsKeptAsLongAsClientsUseThem: an application reading through
// database/sql with a 2 s staleness limit is the pincushion's only
// client; the pincushion, configured to keep pins a minute, keeps none
// much older than 2 s, because a pin no transaction may read only holds
// back PostgreSQL's cleanup of old row versions.
func TestPinsKeptAsLongAsClientsUseThem(t *testing.T) {
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100)", readBalance)
	s.invOpts.MaxStaleness = time.Minute
	s.startInvalidator(t)
	s.startNode(t, "127.0.0.1:0")
	dsn := strings.Replace(s.dsn(), "larder.staleness=5s", "larder.staleness=2s", 1)
	if dsn == s.dsn() {
		t.Fatal("the test DSN has no larder.staleness=5s to replace")
	}
	db := openDB(t, "larder", dsn)
	ctx := context.Background()
	nc, err := nats.Connect(s.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	const watch = 8 * time.Second
	start := time.Now()
	for time.Since(start) < watch {
		// A write between pins, so that each pin is one of its own (a
		// pin at the same timestamp replaces the older), and a read.
		if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 2"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		var bal int
		if err := tx.QueryRowContext(ctx, readBalance, 1).Scan(&bal); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	msg, err := nc.Request(invalidation.PinListSubject(s.prefix), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pins, err := invalidation.DecodePinList(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) < 2 {
		t.Fatalf("the pincushion holds %d pins after %s of writes", len(pins), watch)
	}
	// 2 s, the margin of a second, a pin interval between prunes, and
	// slack for a loaded machine.
	oldest := time.Since(pins[0].TakenAt)
	if oldest > 4*time.Second {
		t.Fatalf("the oldest of %d pins is %s old; the only client reads at most 2 s back", len(pins), oldest.Round(time.Millisecond))
	}
	t.Logf("%d pins, the oldest %s old", len(pins), oldest.Round(time.Millisecond))
}
