package overlay

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestIdentityFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.key")
	k1, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", st.Mode(), err)
	}
	k2, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equals(k2) {
		t.Fatal("the key file gave another key")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("files left beside the key: %v", entries)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(path); err == nil || !strings.Contains(err.Error(), "group or others") {
		t.Fatalf("world-readable key: %v", err)
	}

	corrupt := filepath.Join(dir, "corrupt.key")
	if err := os.WriteFile(corrupt, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(corrupt); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt key: %v", err)
	}

	other, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, err := crypto.MarshalPrivateKey(other)
	if err != nil {
		t.Fatal(err)
	}
	secp := filepath.Join(dir, "secp.key")
	if err := os.WriteFile(secp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(secp); err == nil || !strings.Contains(err.Error(), "Ed25519") {
		t.Fatalf("secp256k1 key: %v", err)
	}
}

func TestPSKFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "swarm.key")
	psk, err := WritePSK(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadPSK(path)
	if err != nil || string(got) != string(psk) {
		t.Fatalf("ReadPSK: %x %v, want %x", got, err, psk)
	}
	if _, err := WritePSK(path); err == nil {
		t.Fatal("WritePSK overwrote a key")
	}
	for name, text := range map[string]string{
		"short":  "/key/swarm/psk/1.0.0/\n/base16/\nabcd\n",
		"header": "/key/swarm/psk/2.0.0/\n/base16/\n" + strings.Repeat("ab", 32) + "\n",
		"empty":  "",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadPSK(p); err == nil {
			t.Errorf("%s: read as a key", name)
		}
	}
	open := filepath.Join(dir, "open.key")
	if err := os.WriteFile(open, []byte("/key/swarm/psk/1.0.0/\n/base16/\n"+strings.Repeat("ab", 32)+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPSK(open); err == nil || !strings.Contains(err.Error(), "group or others") {
		t.Fatalf("group-readable PSK: %v", err)
	}
}

func TestAllowListFile(t *testing.T) {
	dir := t.TempDir()
	var ids []peer.ID
	for range 2 {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(k)
		ids = append(ids, id)
	}
	path := filepath.Join(dir, "allow")
	text := "# the members\n" + ids[0].String() + "  node-a\n\n   " + ids[1].String() + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadAllowList(path)
	if err != nil || len(got) != 2 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("ReadAllowList: %v %v", got, err)
	}
	for name, text := range map[string]string{"empty": "# nobody\n\n", "bad": ids[0].String() + "\nnot-a-peer\n"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadAllowList(p); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name == "bad" && !strings.Contains(err.Error(), ":2:") {
			t.Errorf("%s: %v, want the line number", name, err)
		}
	}
}

func TestParseBootstrap(t *testing.T) {
	k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(k)
	infos, err := ParseBootstrap([]string{"/ip4/127.0.0.1/tcp/4001/p2p/" + id.String(), "/ip4/127.0.0.2/tcp/4001/p2p/" + id.String(), ""})
	if err != nil || len(infos) != 1 || infos[0].ID != id || len(infos[0].Addrs) != 2 {
		t.Fatalf("ParseBootstrap: %v %v", infos, err)
	}
	if _, err := ParseBootstrap([]string{"/ip4/127.0.0.1/tcp/4001"}); err == nil {
		t.Fatal("a bootstrap address without /p2p/ID was accepted")
	}
}
