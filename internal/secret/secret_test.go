package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"nats://invalidator:s3cr3t@127.0.0.1:4222", "nats://invalidator:xxxxx@127.0.0.1:4222"},
		{"nats://tok3n@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222"},
		{"nats://a:p1@h1:4222,nats://a:p2@h2:4222", "nats://a:xxxxx@h1:4222,nats://a:xxxxx@h2:4222"},
		{"redis://larder:hunter2@127.0.0.1:6379/0", "redis://larder:xxxxx@127.0.0.1:6379/0"},
		{"rediss://:hunter2@127.0.0.1:6379/0", "rediss://:xxxxx@127.0.0.1:6379/0"},
		{"postgres://app:pw@db/app?sslmode=disable", "postgres://app:xxxxx@db/app?sslmode=disable"},
		{"postgres://app@db/app?password=pw&sslmode=disable", "postgres://app@db/app?password=xxxxx&sslmode=disable"},
		{"host=db user=app password='p w' dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db password=pw", "host=db password=xxxxx"},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"memory", "memory"},
	}
	for _, c := range cases {
		if got := RedactURL(c.in); got != c.want {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	msg := `dial nats://u:s3cr3t@10.0.0.1:4222: refused; redis: redis://x:hunter2@h/0 password=pw`
	got := Redact(msg)
	for _, s := range []string{"s3cr3t", "hunter2", "pw "} {
		if strings.Contains(got, s) {
			t.Errorf("Redact left %q in %q", s, got)
		}
	}
	if !strings.Contains(got, "10.0.0.1:4222") {
		t.Errorf("Redact removed the address: %q", got)
	}
}

func TestFromFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "pw")
	if err := os.WriteFile(p, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := FromFile(p); err != nil || s != "hunter2" {
		t.Fatalf("FromFile = %q, %v", s, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := FromFile(p); err == nil {
		t.Fatal("an empty secret file was accepted")
	}
}

func FuzzRedactURL(f *testing.F) {
	f.Add("nats://u:secret@h:4222")
	f.Add("host=db password=secret")
	f.Fuzz(func(t *testing.T, s string) {
		out := RedactURL(s)
		if strings.Contains(s, "://u:secret@") && strings.Contains(out, "secret@") {
			t.Fatalf("RedactURL(%q) = %q keeps the password", s, out)
		}
	})
}
