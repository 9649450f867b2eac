package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/overlay"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// overlayFiles are the files of a two-member overlay: a pre-shared key,
// two identities and the allow-list naming both.
type overlayFiles struct {
	psk, allow string
	keys       []string
	ids        []peer.ID
}

func makeOverlayFiles(t *testing.T, n int) overlayFiles {
	t.Helper()
	dir := t.TempDir()
	f := overlayFiles{psk: filepath.Join(dir, "swarm.key"), allow: filepath.Join(dir, "allow")}
	if _, err := overlay.WritePSK(f.psk); err != nil {
		t.Fatal(err)
	}
	var list strings.Builder
	for i := range n {
		key := filepath.Join(dir, fmt.Sprintf("node%d.key", i))
		var out bytes.Buffer
		if code := showPeerID(key, &out, io.Discard); code != 0 {
			t.Fatalf("showPeerID: exit %d", code)
		}
		id, err := peer.Decode(strings.TrimSpace(out.String()))
		if err != nil {
			t.Fatal(err)
		}
		f.keys, f.ids = append(f.keys, key), append(f.ids, id)
		fmt.Fprintln(&list, id)
	}
	if err := os.WriteFile(f.allow, []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestOverlayFlags(t *testing.T) {
	f := makeOverlayFiles(t, 1)
	missing := filepath.Join(t.TempDir(), "none")
	base := []string{"--insecure-no-auth", "--p2p-listen", "127.0.0.1:0", "--p2p-key", f.keys[0]}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure-no-auth", "--p2p-psk", f.psk}, "need --p2p-listen"},
		{[]string{"--insecure-no-auth", "--p2p-listen", "127.0.0.1:0"}, "--p2p-key"},
		{base, "must be authenticated"},
		{append(slices.Clone(base), "--p2p-psk", f.psk), "must be authenticated"},
		{append(slices.Clone(base), "--p2p-psk", f.psk, "--p2p-allow", f.allow, "--p2p-insecure-open"), "contradict"},
		{append(slices.Clone(base), "--p2p-psk", missing, "--p2p-allow", f.allow), "--p2p-psk"},
		{append(slices.Clone(base), "--p2p-psk", f.psk, "--p2p-allow", missing), "--p2p-allow"},
		{append(slices.Clone(base), "--p2p-psk", f.psk, "--p2p-allow", f.allow, "--p2p-bootstrap", "/ip4/127.0.0.1/tcp/1"), "--p2p-bootstrap"},
		{[]string{"--p2p-show-id"}, "--p2p-key"},
	} {
		var out bytes.Buffer
		if code := run(c.args, &out); code != 2 || !strings.Contains(out.String(), c.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", c.args, code, out.String(), c.want)
		}
	}
	// No --p2p-listen: no overlay.
	o, err := parseFlags([]string{"--insecure-no-auth"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := o.daemon(); err != nil || d.Overlay != nil {
		t.Fatalf("default options: overlay %+v %v", d.Overlay, err)
	}
	// The identity file keeps its peer ID.
	var out bytes.Buffer
	if code := showPeerID(f.keys[0], &out, io.Discard); code != 0 || strings.TrimSpace(out.String()) != f.ids[0].String() {
		t.Fatalf("showPeerID again: exit %d %q, want %s", code, out.String(), f.ids[0])
	}
}

// TestOverlayForwardsBetweenDaemons runs two cache-node daemons in one
// overlay, configured by their flags. Puts sent to one node over the TCP
// protocol land on each key's master: each node then holds exactly the
// keys it masters.
func TestOverlayForwardsBetweenDaemons(t *testing.T) {
	f := makeOverlayFiles(t, 2)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := fmt.Sprintf("p2p%d", e2eSeq.Add(1))

	type member struct {
		ov *overlay.Overlay
		cl *protocol.Client
	}
	startMember := func(i int, bootstrap string) member {
		args := []string{"--insecure-no-auth", "--listen", "127.0.0.1:0", "--nats", env.NATS.URL(), "--prefix", prefix, "--metrics", "",
			"--p2p-listen", "/ip4/127.0.0.1/tcp/0", "--p2p-key", f.keys[i], "--p2p-psk", f.psk, "--p2p-allow", f.allow}
		if bootstrap != "" {
			args = append(args, "--p2p-bootstrap", bootstrap)
		}
		o, err := parseFlags(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		d, err := o.daemon()
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan *overlay.Overlay, 1)
		d.OverlayStarted = func(ov *overlay.Overlay) { started <- ov }
		ready, done := make(chan string, 1), make(chan error, 1)
		go func() { done <- daemon.Run(ctx, d, quiet, ready) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node %d: %v", i, err)
			}
		})
		var addr string
		select {
		case addr = <-ready:
		case err := <-done:
			t.Fatalf("node %d: %v", i, err)
		}
		ov := <-started
		if ov.ID() != f.ids[i] {
			t.Fatalf("node %d has peer ID %s, its key file %s", i, ov.ID(), f.ids[i])
		}
		cl := protocol.NewClient(addr, 2)
		t.Cleanup(func() { cl.Close() })
		return member{ov, cl}
	}
	a := startMember(0, "")
	var boot []string
	for _, ad := range a.ov.Addrs() {
		boot = append(boot, ad.String())
	}
	b := startMember(1, strings.Join(boot, ","))
	want := slices.Sorted(slices.Values(f.ids))
	for deadline := time.Now().Add(60 * time.Second); !slices.Equal(a.ov.Members(), want) || !slices.Equal(b.ov.Members(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("members: %v and %v, want %v", a.ov.Members(), b.ov.Members(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}

	mastered := map[peer.ID]int64{}
	dep := store.Dep{Tag: "public.items(id)=1", Table: "public.items", Reads: []string{"name"}}
	for i := range 40 {
		key := []byte(fmt.Sprintf("key-%d", i))
		mastered[a.ov.Master(key)]++
		if err := a.cl.Put(ctx, &protocol.PutRequest{Key: key, Snapshot: 100, Deps: []store.Dep{dep}, Value: []byte("v")}); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		if _, err := b.cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: 100, TMax: 100}); err != nil {
			t.Fatalf("lookup %s through the other node: %v", key, err)
		}
	}
	for _, m := range []member{a, b} {
		st, err := m.cl.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Keys != mastered[m.ov.ID()] {
			t.Errorf("node %s holds %d keys, masters %d of them", m.ov.ID(), st.Keys, mastered[m.ov.ID()])
		}
	}
	if mastered[a.ov.ID()] == 0 || mastered[b.ov.ID()] == 0 {
		t.Logf("one node masters none of the 40 keys: %v", mastered)
	}
}
