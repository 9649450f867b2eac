package larder

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
