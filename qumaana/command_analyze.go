package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/qumaana/quma"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runAnalyze(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	schemaFile := fs.String("schema", "", "DDL file (CREATE TABLE / INDEX / VIEW / FUNCTION)")
	dbURL := fs.String("db", "", "PostgreSQL URL to read the schema from the catalogs")
	var templates, logs, pgss multiFlag
	fs.Var(&templates, "templates", "file of SQL templates ($n or ? parameters, ; separated); repeatable")
	fs.Var(&logs, "log", "PostgreSQL server log with log_statement=all (stderr or csvlog); repeatable")
	fs.Var(&pgss, "pgss", "pg_stat_statements export (CSV or TSV with a header); repeatable")
	format := fs.String("format", "text", "output format: text or json")
	out := fs.String("o", "", "output file (default: standard output)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*schemaFile == "") == (*dbURL == "") {
		return errors.New("analyze: give exactly one of --schema FILE or --db URL")
	}
	if len(templates)+len(logs)+len(pgss) == 0 {
		return errors.New("analyze: give a workload: --templates, --log or --pgss")
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("analyze: --format %q: want text or json", *format)
	}

	schema, err := loadSchema(*schemaFile, *dbURL)
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	var workload []quma.Statement
	var warnings []string
	read := func(files []string, fn func(io.Reader, string) ([]quma.Statement, []string, error)) error {
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				return fmt.Errorf("analyze: %w", err)
			}
			sts, warns, err := fn(fh, f)
			fh.Close()
			if err != nil {
				return err
			}
			workload = append(workload, sts...)
			warnings = append(warnings, warns...)
		}
		return nil
	}
	readTemplates := func(r io.Reader, name string) ([]quma.Statement, []string, error) {
		sts, err := quma.ReadTemplates(r, name)
		return sts, nil, err
	}
	if err := read(templates, readTemplates); err != nil {
		return err
	}
	if err := read(logs, quma.ReadServerLog); err != nil {
		return err
	}
	if err := read(pgss, quma.ReadPGSS); err != nil {
		return err
	}

	sol, err := quma.AnalyzeWorkload(schema, workload)
	if sol == nil {
		return err
	}
	sol.Warnings = append(sol.Warnings, warnings...)
	analysisErr := err

	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return fmt.Errorf("analyze: %w", err)
		}
		defer f.Close()
		w = f
	}
	if *format == "json" {
		err = sol.WriteJSON(w)
	} else {
		err = sol.WriteText(w)
	}
	if err != nil {
		return fmt.Errorf("analyze: write: %w", err)
	}
	if analysisErr != nil {
		return fmt.Errorf("analyze: some statements could not be analyzed:\n%w", analysisErr)
	}
	return nil
}

// loadSchema reads the schema from a DDL file or, when file is "", from
// the catalogs of the database at dbURL.
func loadSchema(file, dbURL string) (*quma.Schema, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		s, err := quma.LoadDDL(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return s, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	return quma.LoadCatalog(ctx, conn)
}
