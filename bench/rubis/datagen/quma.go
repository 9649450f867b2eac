package datagen

import (
	"context"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/qumaana/quma"
)

// WriteQUMA analyzes the database's schema with RUBiS's templates into path
// (the QUMA file of the invalidator and the clients).
func WriteQUMA(ctx context.Context, pgURL, path string) (string, error) {
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	schema, err := quma.LoadCatalog(ctx, conn)
	if err != nil {
		return "", err
	}
	work, err := quma.ReadTemplates(strings.NewReader(TemplatesSQL()), "templates.sql")
	if err != nil {
		return "", err
	}
	sol, err := quma.AnalyzeWorkload(schema, work)
	if err != nil {
		return "", err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := sol.WriteJSON(f); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}
