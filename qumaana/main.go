package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "analyze":
		err = runAnalyze(os.Args[2:], os.Stdout)
	case "explain":
		err = runExplain(os.Args[2:], os.Stdin, os.Stdout)
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "qumaana: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "qumaana:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: qumaana analyze (--schema FILE | --db URL) (--templates FILE | --log FILE | --pgss FILE)...
                       [--format text|json] [-o FILE]
       qumaana explain (--schema FILE | --db URL | --quma FILE) [--quma FILE]
                       [--metrics URL[,URL...]] [--format text|json] [--timeout 5s] [SQL | -]

analyze: analyzes SQL templates into invalidation groups (the QUMA solution) for Larder.
explain: says what Larder does with one statement (from the arguments or standard input):
         cacheable or why not, clock-bound, its template id, tags, tag column sets and
         columns read; with --metrics, its template's live figures.
`)
}
