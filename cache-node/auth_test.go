package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/pki"
)

// credentials are a CA with a node certificate and a client certificate
// it signed, in files.
type credentials struct {
	ca, nodeCert, nodeKey, clientCert, clientKey string
}

func makeCredentials(t *testing.T, dir string) credentials {
	t.Helper()
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := credentials{ca: filepath.Join(dir, "ca.pem")}
	if err := writeFile(c.ca, ca.PEM); err != nil {
		t.Fatal(err)
	}
	node, err := ca.IssueServer("node", []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c.nodeCert, c.nodeKey, err = node.Write(dir, "node"); err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssueClient("client", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c.clientCert, c.clientKey, err = client.Write(dir, "client"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestProtocolRefusesUnauthenticatedPeers starts a node as its flags
// configure it (mutual TLS) and tries it the ways an attacker on the
// network would: a forged put over plain TCP, TLS without a client
// certificate, and a certificate from another CA. Each is refused and
// stores nothing; a client with the CA's certificate is served.
func TestProtocolRefusesUnauthenticatedPeers(t *testing.T) {
	good := makeCredentials(t, t.TempDir())
	rogue := makeCredentials(t, t.TempDir())
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"--listen", "127.0.0.1:0", "--nats", env.NATS.URL(), "--metrics", "",
		"--tls-cert", good.nodeCert, "--tls-key", good.nodeKey, "--tls-client-ca", good.ca}, &stderr)
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	do, err := o.daemon()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- daemon.Run(ctx, do, slog.New(slog.NewTextHandler(io.Discard, nil)), ready) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}

	forged := &protocol.PutRequest{Key: []byte("accounts-1"), Snapshot: 1, Template: "t",
		Deps: []store.Dep{{Tag: "public.accounts(id)=1", Table: "public.accounts", Reads: []string{"balance"}}}, Value: []byte("999999")}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	attackers := map[string]*protocol.Client{
		"plain TCP": protocol.NewClient(addr, 1),
	}
	noCert, err := pki.ClientTLS(good.ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	attackers["TLS without a client certificate"] = protocol.NewTLSClient(addr, 1, noCert)
	other, err := pki.ClientTLS(good.ca, rogue.clientCert, rogue.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	attackers["a certificate from another CA"] = protocol.NewTLSClient(addr, 1, other)
	for name, cl := range attackers {
		err := cl.Put(rctx, forged)
		if err == nil {
			t.Errorf("%s: the forged put was accepted", name)
		} else if protocol.IsRemote(err) {
			t.Errorf("%s: the request reached the node: %v", name, err)
		}
		if _, err := cl.Lookup(rctx, &protocol.LookupRequest{Key: forged.Key, TMin: 0, TMax: 1 << 62}); err == nil {
			t.Errorf("%s: a lookup was served", name)
		}
		cl.Close()
	}

	cfg, err := pki.ClientTLS(good.ca, good.clientCert, good.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	cl := protocol.NewTLSClient(addr, 1, cfg)
	defer cl.Close()
	st, err := cl.Stats(rctx)
	if err != nil {
		t.Fatalf("the authenticated client: %v", err)
	}
	if st.Keys != 0 || st.Versions != 0 {
		t.Fatalf("the node holds %d keys / %d versions after the refused puts", st.Keys, st.Versions)
	}
}

func TestFlagsRequireAuthentication(t *testing.T) {
	creds := makeCredentials(t, t.TempDir())
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--insecure-no-auth"},
		{[]string{"--tls-cert", creds.nodeCert}, "all of"},
		{[]string{"--tls-cert", creds.nodeCert, "--tls-key", creds.nodeKey, "--tls-client-ca", creds.ca, "--insecure-no-auth"}, "contradict"},
		{[]string{"--tls-cert", creds.nodeCert, "--tls-key", creds.nodeKey, "--tls-client-ca", filepath.Join(t.TempDir(), "none.pem")}, "CA"},
		{[]string{"--insecure-no-auth", "--nats-nkey", filepath.Join(t.TempDir(), "none.nk")}, "--nats-nkey"},
	} {
		var out bytes.Buffer
		if code := run(c.args, &out); code != 2 || !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", c.args, code, out.String(), c.want)
		}
	}
	var out bytes.Buffer
	o, err := parseFlags([]string{"--tls-cert", creds.nodeCert, "--tls-key", creds.nodeKey, "--tls-client-ca", creds.ca}, &out)
	if err != nil {
		t.Fatal(err)
	}
	d, err := o.daemon()
	if err != nil {
		t.Fatal(err)
	}
	if d.TLS == nil || d.TLS.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("TLS config %+v does not require client certificates", d.TLS)
	}
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }

// A node that cannot reach NATS or Redis says so without printing the
// password in the URL it was given.
func TestErrorsDoNotPrintPasswords(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := daemon.Run(ctx, daemon.Options{Listen: "127.0.0.1:0", NATS: "nats://larder:s3cr3t-nats@127.0.0.1:1", Store: "memory", Memory: 1 << 20}, quiet, nil)
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("NATS unreachable: %v", err)
	}
	err = daemon.Run(ctx, daemon.Options{Listen: "127.0.0.1:0", NATS: env.NATS.URL(), Store: "redis://larder:s3cr3t-redis@127.0.0.1:1/0", Memory: 1 << 20}, quiet, nil)
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Redis unreachable: %v", err)
	}
}
