package larder

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkReadOnlyTransaction: one read-only transaction reading one
// row, on plain pgx and through Larder (miss path with no cache at all,
// L1 hit, node hit), in the same run.
func BenchmarkReadOnlyTransaction(b *testing.B) {
	s := startStackB(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.Run("pgx", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var bal int
			err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, readBalance, 1+i%accounts).Scan(&bal)
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	run := func(name string, c *Client) {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				tx, err := c.BeginRO(ctx, 0)
				if err != nil {
					b.Fatal(err)
				}
				var bal int
				if err := tx.QueryRow(ctx, readBalance, []any{1 + i%accounts}, &bal); err != nil {
					b.Fatal(err)
				}
				_ = tx.Commit(ctx)
			}
		})
	}
	run("larder-miss-no-cache", s.clientB(b, nil, 0))
	run("larder-L1-hit", s.clientB(b, []string{s.node}, 8<<20))
	run("larder-node-hit", s.clientB(b, []string{s.node}, 0))
}
