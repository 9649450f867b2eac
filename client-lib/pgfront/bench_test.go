package pgfront

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkStatement is one statement (an account's balance by key)
// answered, side by side: from the cache through the front (pgx's
// prepared statements; the simple protocol), from the cache through the
// Go library, by PostgreSQL directly, and relayed by the front outside a
// Larder transaction. Each runs inside one transaction, so every Larder
// answer after the first is an L1 hit.
//
//	go test -run '^$' -bench Statement -benchtime 20000x ./client-lib/pgfront
func BenchmarkStatement(b *testing.B) {
	s := typesStack(b)
	ctx := context.Background()
	inTx := func(b *testing.B, url, begin string, mode pgx.QueryExecMode) {
		conn := connect(b, url)
		if begin != "" {
			if _, err := conn.Exec(ctx, begin); err != nil {
				b.Fatal(err)
			}
		}
		var n int
		if err := conn.QueryRow(ctx, readBalance, mode, 1).Scan(&n); err != nil {
			b.Fatal(err)
		}
		hits := s.front.Stats().Hits.Load()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := conn.QueryRow(ctx, readBalance, mode, 1).Scan(&n); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if begin != "" {
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(s.front.Stats().Hits.Load()-hits)/float64(b.N), "front-hits/op")
	}
	b.Run("front-hit-prepared", func(b *testing.B) { inTx(b, s.frontURL, "BEGIN READ ONLY", pgx.QueryExecModeCacheStatement) })
	b.Run("front-hit-simple", func(b *testing.B) { inTx(b, s.frontURL, "BEGIN READ ONLY", pgx.QueryExecModeSimpleProtocol) })
	b.Run("library-hit", func(b *testing.B) {
		tx, err := s.client.BeginRO(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Commit(ctx)
		var n int
		if err := tx.QueryRow(ctx, readBalance, []any{1}, &n); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := tx.QueryRow(ctx, readBalance, []any{1}, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("postgres-prepared", func(b *testing.B) { inTx(b, s.url, "BEGIN READ ONLY", pgx.QueryExecModeCacheStatement) })
	b.Run("postgres-simple", func(b *testing.B) { inTx(b, s.url, "BEGIN READ ONLY", pgx.QueryExecModeSimpleProtocol) })
	b.Run("front-relayed-prepared", func(b *testing.B) { inTx(b, s.frontURL, "", pgx.QueryExecModeCacheStatement) })
}

// BenchmarkTransaction is a whole read-only transaction of one statement
// (BEGIN READ ONLY, the balance, COMMIT): through the front, through the
// library, and on PostgreSQL.
func BenchmarkTransaction(b *testing.B) {
	s := typesStack(b)
	ctx := context.Background()
	viaConn := func(b *testing.B, url string) {
		conn := connect(b, url)
		var n int
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
				b.Fatal(err)
			}
			if err := conn.QueryRow(ctx, readBalance, 1).Scan(&n); err != nil {
				b.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("front", func(b *testing.B) {
		hits := s.front.Stats().Hits.Load()
		viaConn(b, s.frontURL)
		b.ReportMetric(float64(s.front.Stats().Hits.Load()-hits)/float64(b.N), "front-hits/op")
	})
	b.Run("library", func(b *testing.B) {
		var n int
		for i := 0; i < b.N; i++ {
			tx, err := s.client.BeginRO(ctx, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := tx.QueryRow(ctx, readBalance, []any{1}, &n); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("postgres", func(b *testing.B) { viaConn(b, s.url) })
}
