package larder

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/pki"
)

// Each DSN mistake gets a clear error from ParseDSN (so at sql.Open's
// first connection, before anything runs).
func TestDSNMistakes(t *testing.T) {
	dir := t.TempDir()
	base := "postgres://h/db?larder.nats=n&larder.quma=q"
	for param, want := range map[string]string{
		"larder.unsafe-ignore-consistency=yes":                 "unknown DSN parameter",
		"larder.ignore-consistency=yes":                        "unknown DSN parameter",
		"larder.prefix=a%20b":                                  "not a valid subject prefix",
		"larder.prefix=larder.":                                "not a valid subject prefix",
		"larder.l1=lots":                                       "larder.l1",
		"larder.l1=-5":                                         "larder.l1",
		"larder.staleness=1000h":                               "more than 24h",
		"larder.register-tag-sets=perhaps":                     "want true or false",
		"larder.split-rows=perhaps":                            "want true or false",
		"larder.l1-broadcast=perhaps":                          "want true or false",
		"larder.staleness=-1s":                                 "positive duration",
		"larder.node-cert=c.pem&larder.node-key=k":             "need larder.node-ca",
		"larder.node-ca=" + filepath.Join(dir, "missing.pem"):  "cache-node TLS",
		"larder.nats-nkey=" + filepath.Join(dir, "missing.nk"): "larder.nats-nkey",
	} {
		if _, err := ParseDSN(base + "&" + param); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", param, err, want)
		}
	}
	cfg, err := ParseDSN(base + "&larder.l1=64MiB&larder.staleness=2m&larder.node-timeout=50ms&larder.node-backoff=1s&larder.pin-verify-timeout=300ms&larder.pin-silence=2s")
	if err != nil || cfg.L1Bytes != 64<<20 || cfg.Staleness != 2*time.Minute || cfg.NodeTimeout != 50*time.Millisecond ||
		cfg.NodeBackoff != time.Second || cfg.PinVerifyTimeout != 300*time.Millisecond || cfg.PinSilence != 2*time.Second {
		t.Fatalf("%+v, %v", cfg, err)
	}
	if cfg.NoRegisterTagSets {
		t.Error("tag set registration is off by default")
	}
	if cfg, err := ParseDSN(base + "&larder.register-tag-sets=false"); err != nil || !cfg.NoRegisterTagSets {
		t.Errorf("larder.register-tag-sets=false: %+v, %v", cfg.NoRegisterTagSets, err)
	}
	if cfg.NoRowSplit {
		t.Error("the row split is off by default")
	}
	if cfg, err := ParseDSN(base + "&larder.l1-broadcast=true"); err != nil || !cfg.L1Broadcast {
		t.Errorf("larder.l1-broadcast=true: %+v, %v", cfg.L1Broadcast, err)
	}
	if cfg, err := ParseDSN(base + "&larder.split-rows=false"); err != nil || !cfg.NoRowSplit {
		t.Errorf("larder.split-rows=false: %+v, %v", cfg.NoRowSplit, err)
	}
	if _, err := ParseDSN(base + "&larder.node-timeout=0s"); err == nil || !strings.Contains(err.Error(), "larder.node-timeout") {
		t.Fatalf("larder.node-timeout=0s: %v", err)
	}
	if cfg.FreshReadWait != 0 {
		t.Errorf("the DSN sets a fresh read wait of %s by default (Open's default applies)", cfg.FreshReadWait)
	}
	if cfg, err := ParseDSN(base + "&larder.fresh-read-wait=5ms"); err != nil || cfg.FreshReadWait != 5*time.Millisecond {
		t.Errorf("larder.fresh-read-wait=5ms: %s, %v", cfg.FreshReadWait, err)
	}
	if cfg, err := ParseDSN(base + "&larder.fresh-read-wait=0s"); err != nil || cfg.FreshReadWait >= 0 {
		t.Errorf("larder.fresh-read-wait=0s (no wait): %s, %v", cfg.FreshReadWait, err)
	}
	for _, v := range []string{"-1ms", "2m", "soon"} {
		if _, err := ParseDSN(base + "&larder.fresh-read-wait=" + v); err == nil || !strings.Contains(err.Error(), "larder.fresh-read-wait") {
			t.Errorf("larder.fresh-read-wait=%s: %v", v, err)
		}
	}
	if cfg.ParkIdle != 0 {
		t.Errorf("the DSN sets a park idle of %s by default (Open's default applies)", cfg.ParkIdle)
	}
	if cfg, err := ParseDSN(base + "&larder.park-prefer=300ms"); err != nil || cfg.ParkPrefer != 300*time.Millisecond {
		t.Errorf("larder.park-prefer=300ms: %s, %v", cfg.ParkPrefer, err)
	}
	if cfg, err := ParseDSN(base + "&larder.park-prefer=0s"); err != nil || cfg.ParkPrefer >= 0 {
		t.Errorf("larder.park-prefer=0s (always the newest pin): %s, %v", cfg.ParkPrefer, err)
	}
	for _, v := range []string{"-1s", "2m", "soon"} {
		if _, err := ParseDSN(base + "&larder.park-prefer=" + v); err == nil || !strings.Contains(err.Error(), "larder.park-prefer") {
			t.Errorf("larder.park-prefer=%s: %v", v, err)
		}
	}
	if cfg, err := ParseDSN(base + "&larder.park-idle=50ms"); err != nil || cfg.ParkIdle != 50*time.Millisecond {
		t.Errorf("larder.park-idle=50ms: %s, %v", cfg.ParkIdle, err)
	}
	if cfg, err := ParseDSN(base + "&larder.park-idle=0s"); err != nil || cfg.ParkIdle >= 0 {
		t.Errorf("larder.park-idle=0s (none parks): %s, %v", cfg.ParkIdle, err)
	}
	for _, v := range []string{"-1ms", "11s", "soon"} {
		if _, err := ParseDSN(base + "&larder.park-idle=" + v); err == nil || !strings.Contains(err.Error(), "larder.park-idle") {
			t.Errorf("larder.park-idle=%s: %v", v, err)
		}
	}
}

// The node and NATS credentials of a DSN become the client's TLS
// configuration and NATS options.
func TestDSNCredentials(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	issued, err := ca.IssueClient("client", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := issued.Write(dir, "client")
	if err != nil {
		t.Fatal(err)
	}
	nk, err := pki.NewUserNkey()
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "client.nk")
	if err := nk.WriteSeed(seed); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseDSN("postgres://h/db?larder.nats=n&larder.quma=q&larder.node-ca=" + caFile + "&larder.node-cert=" + cert + "&larder.node-key=" + key + "&larder.nats-nkey=" + seed)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeTLS == nil || len(cfg.NodeTLS.Certificates) != 1 || cfg.NodeTLS.RootCAs == nil {
		t.Fatalf("NodeTLS %+v", cfg.NodeTLS)
	}
	if len(cfg.NATSOptions) != 1 {
		t.Fatalf("NATSOptions: %d", len(cfg.NATSOptions))
	}
	if strings.Contains(cfg.PostgresURL, "larder.") {
		t.Fatalf("PostgresURL keeps Larder's parameters: %s", cfg.PostgresURL)
	}
}
