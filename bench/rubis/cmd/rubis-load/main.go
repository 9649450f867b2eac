// Command rubis-load creates and fills a RUBiS database.
//
//	go run ./bench/rubis/cmd/rubis-load --pg postgres://… [--preset txcache-memory|original] [--scale 0.1] [--seed 1]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/bench/rubis/datagen"
)

func main() {
	pg := flag.String("pg", os.Getenv("LARDER_PG_URL"), "PostgreSQL URL of the database to fill (its RUBiS tables are replaced)")
	preset := flag.String("preset", "txcache-memory", "size preset: original or txcache-memory")
	scale := flag.Float64("scale", 1, "multiply users and items by this")
	seed := flag.Int64("seed", 1, "random seed: the same seed and size give the same data")
	flag.Parse()
	sizes := map[string]datagen.Size{"original": datagen.Original, "txcache-memory": datagen.TxCacheInMemory}
	size, ok := sizes[*preset]
	if !ok || *scale <= 0 || *pg == "" {
		fmt.Fprintln(os.Stderr, "rubis-load: need --pg, a --preset of original or txcache-memory, and a positive --scale")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	conn, err := pgx.Connect(ctx, *pg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rubis-load:", err)
		os.Exit(1)
	}
	defer conn.Close(context.Background())
	start := time.Now()
	size = size.Scaled(*scale)
	counts, err := datagen.Load(ctx, conn, datagen.Config{Size: size, Seed: *seed, Progress: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "rubis-load:", err)
		os.Exit(1)
	}
	var rows int64
	for _, n := range counts {
		rows += n
	}
	fmt.Printf("rubis-load: %d rows (%d users, %d active items, %d old items) in %s\n", rows, size.Users, size.ActiveItems, size.OldItems, time.Since(start).Round(time.Millisecond))
}
