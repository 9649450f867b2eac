// Command selectsort measures Ganesh's SelectSort comparison: the same
// result queried twice with another ORDER BY, and the bytes on the wire
// for the second query under raw, gzip, zstd, content-defined chunking and
// row recipes (internal/recipe).
//
//	go run ./bench/selectsort                                   # 280 K rows in memory
//	go run ./bench/selectsort -rows 5000 -out /tmp/REPORT.md
//	go run ./bench/selectsort -pg postgres://… -load            # a real table through pgx
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"

	"github.com/larderdb/larder/internal/bytesize"
	"github.com/larderdb/larder/internal/secret"
)

func main() {
	cfg := DefaultConfig()
	flag.IntVar(&cfg.Rows, "rows", cfg.Rows, "rows in the table")
	flag.IntVar(&cfg.RowBytes, "row-bytes", cfg.RowBytes, "average encoded row size")
	flag.Float64Var(&cfg.RandomFraction, "random-fraction", cfg.RandomFraction, "share of the free text that is random characters (0: words only)")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the generated rows")
	flag.StringVar(&cfg.PostgresURL, "pg", "", "PostgreSQL URL: query a real table instead of ordering rows in memory")
	flag.BoolVar(&cfg.Load, "load", false, "with -pg: (re)create the table and fill it with the generated rows")
	flag.StringVar(&cfg.Table, "table", cfg.Table, "with -pg: the table")
	budget := flag.String("edge-bytes", fmt.Sprintf("%dMiB", cfg.Edge.MaxBytes>>20), "edge row store budget")
	flag.IntVar(&cfg.Edge.MaxRows, "edge-rows", cfg.Edge.MaxRows, "edge row store row limit")
	flag.IntVar(&cfg.Repeat, "repeat", cfg.Repeat, "runs of each scheme; times are the best")
	procs := flag.Int("procs", 1, "GOMAXPROCS: 1 measures encoding and decoding on one core")
	out := flag.String("out", "", "also write the report to this file (e.g. bench/selectsort/results/REPORT.md)")
	flag.Parse()
	n, err := bytesize.Parse(*budget)
	if err != nil {
		fail(err)
	}
	cfg.Edge.MaxBytes = n
	runtime.GOMAXPROCS(*procs)
	cfg.Command = commandLine()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	md := rep.Markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			fail(err)
		}
	}
}

// commandLine is how the report says it was made, without the password of
// a -pg URL.
func commandLine() string {
	args := []string{"go run ./bench/selectsort"}
	for _, a := range os.Args[1:] {
		args = append(args, secret.Redact(a))
	}
	return strings.Join(args, " ")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "selectsort:", secret.Redact(err.Error()))
	os.Exit(1)
}
