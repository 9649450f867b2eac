package larder

import (
	"context"
	"testing"
)

// TestRowsAfterCommitKeepTheirOwnTypeMap: Rows read after their
// transaction ended do not decode with the type map the transaction gave
// back to the client's pool, which the next transaction takes (a
// pgtype.Map is not safe for concurrent use).
func TestRowsAfterCommitKeepTheirOwnTypeMap(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 0)
	ctx := context.Background()
	tx, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, readBalance, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Commit(ctx)
	if !rows.Next() {
		t.Fatal("no row")
	}
	if rows.typeMap() == next.m {
		t.Fatal("Rows after Commit decode with the type map the next transaction uses")
	}
	var b int
	if err := rows.Scan(&b); err != nil || b != 100 {
		t.Fatalf("Scan after Commit: %d, %v", b, err)
	}
}
