package pki

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type files struct{ ca, cert, key string }

func issue(t *testing.T) (serverFiles, clientFiles files) {
	t.Helper()
	dir := t.TempDir()
	ca, err := NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer("node", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ca.IssueClient("client", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sc, sk, err := srv.Write(dir, "node")
	if err != nil {
		t.Fatal(err)
	}
	cc, ck, err := cl.Write(dir, "client")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(ck); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("client key mode %v, %v", fi.Mode(), err)
	}
	return files{caFile, sc, sk}, files{caFile, cc, ck}
}

// handshake runs a mutual-TLS handshake between the server's files and a
// client's configuration and returns the client's error.
func handshake(t *testing.T, srv files, client *tls.Config) error {
	t.Helper()
	scfg, err := ServerTLS(srv.cert, srv.key, srv.ca)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c) // echo, once the handshake is done
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// With TLS 1.3 the server's verdict on the client's certificate
	// arrives with the first read.
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 1))
	return err
}

func TestMutualTLS(t *testing.T) {
	srv, cl := issue(t)
	_, other := issue(t)
	good, err := ClientTLS(cl.ca, cl.cert, cl.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, srv, good); err != nil {
		t.Fatalf("a client with the CA's certificate: %v", err)
	}
	noCert, err := ClientTLS(cl.ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, srv, noCert); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	rogue, err := ClientTLS(cl.ca, other.cert, other.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, srv, rogue); err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	wrongCA, err := ClientTLS(other.ca, cl.cert, cl.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, srv, wrongCA); err == nil {
		t.Fatal("the client trusted a server certificate from another CA")
	}
	if _, err := ClientTLS(filepath.Join(t.TempDir(), "none.pem"), "", ""); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
