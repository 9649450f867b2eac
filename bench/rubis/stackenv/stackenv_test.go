package stackenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "stack.env")
	body := "export LARDER_PG_URL='postgres://u:it'\\''s@h/db'\nLARDER_DSN='larder://x'\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := Read(path, "go run ./deploy/local up")
	if err != nil {
		t.Fatal(err)
	}
	if env["LARDER_PG_URL"] != "postgres://u:it's@h/db" || env["LARDER_DSN"] != "larder://x" {
		t.Fatalf("%v", env)
	}
	if _, err := Read(filepath.Join(dir, "none"), "the hint"); err == nil || !strings.Contains(err.Error(), "the hint") {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("LARDER_DSN='x'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, ""); err == nil {
		t.Fatal("a file without LARDER_PG_URL was accepted")
	}
}
