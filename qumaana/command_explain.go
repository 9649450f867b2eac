package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/larderdb/larder/qumaana/explain"
	"github.com/larderdb/larder/qumaana/quma"
)

// runExplain is `qumaana explain`: what Larder does with one statement,
// and, with --metrics, the live figures of its template.
func runExplain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	schemaFile := fs.String("schema", "", "DDL file (CREATE TABLE / INDEX / VIEW / FUNCTION)")
	dbURL := fs.String("db", "", "PostgreSQL URL to read the schema from the catalogs")
	qumaFile := fs.String("quma", "", "the QUMA file the clients load: its tag column sets (and, without --schema or --db, its schema)")
	metrics := fs.String("metrics", "", "Prometheus text endpoints of cache-nodes and applications, comma separated (host:port means http://host:port/metrics)")
	format := fs.String("format", "text", "output format: text or json")
	timeout := fs.Duration("timeout", 5*time.Second, "time allowed to read each metrics endpoint")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("explain: --format %q: want text or json", *format)
	}
	if *schemaFile != "" && *dbURL != "" {
		return errors.New("explain: give one of --schema FILE or --db URL, not both")
	}
	if *schemaFile == "" && *dbURL == "" && *qumaFile == "" {
		return errors.New("explain: no schema: give --schema FILE, --db URL, or a --quma FILE (it carries the schema it was computed with)")
	}
	sql, err := statementText(fs.Args(), stdin)
	if err != nil {
		return err
	}

	var o explain.Options
	if *qumaFile != "" {
		f, err := os.Open(*qumaFile)
		if err != nil {
			return fmt.Errorf("explain: %w", err)
		}
		o.Solution, err = quma.ReadSolution(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("explain: %s: %w", *qumaFile, err)
		}
		o.Schema = o.Solution.Schema
	}
	if *schemaFile != "" || *dbURL != "" {
		if o.Schema, err = loadSchema(*schemaFile, *dbURL); err != nil {
			return fmt.Errorf("explain: %w", err)
		}
	}

	report, err := explain.Statement(sql, o)
	if err != nil {
		var se *quma.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%w\n%s", err, pointAt(sql, se))
		}
		return err
	}
	if *metrics != "" {
		var urls []string
		for _, u := range strings.Split(*metrics, ",") {
			if u = strings.TrimSpace(u); u != "" {
				urls = append(urls, u)
			}
		}
		report.Live = explain.Scrape(context.Background(), &http.Client{Timeout: *timeout}, urls, report.Template)
	}
	if *format == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("explain: write: %w", err)
	}
	if report.Live != nil {
		if n := report.Live.Failed(); n > 0 {
			return fmt.Errorf("explain: %d of %d metrics endpoints could not be read (the report names them)", n, len(report.Live.Endpoints))
		}
	}
	return nil
}

// statementText is the statement: the arguments joined by spaces, or
// standard input when there are none (or the only one is "-").
func statementText(args []string, stdin io.Reader) (string, error) {
	if len(args) > 0 && !(len(args) == 1 && args[0] == "-") {
		return strings.Join(args, " "), nil
	}
	b, err := io.ReadAll(io.LimitReader(stdin, quma.MaxStatementBytes+1))
	if err != nil {
		return "", fmt.Errorf("explain: read standard input: %w", err)
	}
	if len(b) > quma.MaxStatementBytes {
		return "", fmt.Errorf("explain: the statement is over %d KiB", quma.MaxStatementBytes>>10)
	}
	if strings.TrimSpace(string(b)) == "" {
		return "", errors.New("explain: no statement: give it as an argument or on standard input")
	}
	return string(b), nil
}

// pointAt shows the line of sql a syntax error is on, with a caret under
// its column.
func pointAt(sql string, se *quma.SyntaxError) string {
	if se.Line <= 0 {
		return ""
	}
	lines := strings.Split(sql, "\n")
	if se.Line > len(lines) {
		return ""
	}
	line := strings.ReplaceAll(lines[se.Line-1], "\t", " ")
	col := max(se.Column, 1)
	return "  " + line + "\n  " + strings.Repeat(" ", min(col-1, len([]rune(line)))) + "^"
}
