package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/internal/recipe"
)

// loadTable (re)creates the table and fills it with the generated rows.
func loadTable(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+cfg.Table); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, createTable(cfg.Table)); err != nil {
		return err
	}
	rows := generate(cfg)
	names := make([]string, len(columns))
	for i, c := range columns {
		names[i] = c.name
	}
	src := pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		r := &rows[i]
		return []any{r.id, int32(r.k1), int32(r.k2), r.created, r.title, r.body, r.payload}, nil
	})
	n, err := conn.CopyFrom(ctx, pgx.Identifier{cfg.Table}, names, src)
	if err != nil {
		return fmt.Errorf("copy into %s: %w", cfg.Table, err)
	}
	if n != int64(len(rows)) {
		return fmt.Errorf("copied %d rows of %d", n, len(rows))
	}
	_, err = conn.Exec(ctx, "ANALYZE "+cfg.Table)
	return err
}

// queryResult runs sql and cuts its result at row boundaries: the field
// descriptions as the header, each row's raw column values (pgx
// RawValues, as PostgreSQL sent them) as a DataRow body.
func queryResult(ctx context.Context, conn *pgx.Conn, sql string) (recipe.Result, error) {
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return recipe.Result{}, err
	}
	defer rows.Close()
	var res recipe.Result
	for rows.Next() {
		// RawValues alias pgx's read buffer until the next row: the
		// encoding copies them.
		res.Rows = append(res.Rows, encodeRow(nil, rows.RawValues()))
	}
	if err := rows.Err(); err != nil {
		return recipe.Result{}, err
	}
	fds := rows.FieldDescriptions()
	fields := make([]field, len(fds))
	for i, fd := range fds {
		fields[i] = field{name: fd.Name, tableOID: fd.TableOID, attr: int16(fd.TableAttributeNumber), typeOID: fd.DataTypeOID,
			typeSize: fd.DataTypeSize, typeMod: fd.TypeModifier, fmt: fd.Format}
	}
	res.Header = encodeHeader(fields)
	return res, nil
}

// postgresResults runs the two queries on PostgreSQL, loading the table
// first when cfg.Load is set.
func postgresResults(ctx context.Context, cfg Config) (first, second recipe.Result, err error) {
	conn, err := pgx.Connect(ctx, cfg.PostgresURL)
	if err != nil {
		return first, second, err
	}
	defer conn.Close(context.Background())
	if cfg.Load {
		if err := loadTable(ctx, conn, cfg); err != nil {
			return first, second, err
		}
	}
	if first, err = queryResult(ctx, conn, "SELECT * FROM "+cfg.Table+" ORDER BY k1, id"); err != nil {
		return first, second, err
	}
	second, err = queryResult(ctx, conn, "SELECT * FROM "+cfg.Table+" ORDER BY k2, id")
	return first, second, err
}
