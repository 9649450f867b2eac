package servers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
)

// An edge site's NATS server as a leaf node of the hub, each with the
// roles' users, the leaf connection authenticated as RoleLeaf: the edge's
// client asks the invalidator's requests and hears the prefix's
// messages; its cache-node reads the hub's stream through the leaf; only
// subjects someone at the edge subscribes to cross (interest); and
// nothing published at the edge under the prefix reaches the hub, even
// from a leaf that admitted anyone.
func TestLeafNode(t *testing.T) {
	for _, bin := range []string{"", "nats-server"} {
		name := "embedded-hub"
		if bin != "" {
			name = "binary-hub"
		}
		t.Run(name, func(t *testing.T) { testLeafNode(t, bin) })
	}
}

func testLeafNode(t *testing.T, hubBin string) {
	const prefix = "larder"
	dir := t.TempDir()
	roles, err := NewNATSRoles(dir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leafPort, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	hubCfg := DefaultNATSConfig(dir + "/hub")
	hubCfg.Users, hubCfg.LeafPort, hubCfg.Bin = roles.Users, leafPort, hubBin
	hub, err := StartNATS(ctx, hubCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()

	// A leaf with credentials the hub does not know is refused. (Any user
	// of the hub may connect as a leaf, with its own role's permissions:
	// RoleLeaf is the one that lets an edge's cache-node read the stream.)
	stranger, err := pki.NewUserNkey()
	if err != nil {
		t.Fatal(err)
	}
	if err := stranger.WriteSeed(dir + "/stranger.nk"); err != nil {
		t.Fatal(err)
	}
	badCfg := DefaultNATSConfig(dir + "/bad")
	badCfg.Leaf = &NATSLeaf{URL: hub.LeafURL(), Seed: dir + "/stranger.nk"}
	if bad, err := StartNATS(ctx, badCfg); err == nil {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		if bad.WaitLeaf(wctx) == nil {
			t.Error("a leaf with an unknown nkey was admitted")
		}
		wcancel()
		_ = bad.Close()
	}

	var edgeUsers []NATSUser
	for i, r := range invalidation.Roles {
		if r == invalidation.RoleClient || r == invalidation.RoleCacheNode {
			edgeUsers = append(edgeUsers, roles.Users[i])
		}
	}
	leafCfg := DefaultNATSConfig(dir + "/leaf")
	leafCfg.Users = edgeUsers
	leafCfg.Leaf = &NATSLeaf{URL: hub.LeafURL(), Seed: roles.Seeds[invalidation.RoleLeaf]}
	leaf, err := StartNATS(ctx, leafCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer leaf.Close()
	if err := leaf.WaitLeaf(ctx); err != nil {
		t.Fatal(err)
	}
	connect := func(url string, role invalidation.Role) *nats.Conn {
		t.Helper()
		opt, err := nats.NkeyOptionFromSeed(roles.Seeds[role])
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, opt, nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s at %s: %v", role, url, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	inv := connect(hub.URL(), invalidation.RoleInvalidator)
	client, node := connect(leaf.URL(), invalidation.RoleClient), connect(leaf.URL(), invalidation.RoleCacheNode)
	if _, err := nats.Connect(leaf.URL(), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a stranger at the leaf: %v, want an authorization violation", err)
	}

	// The invalidator's stream, at the hub.
	ijs, err := jetstream.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	stream := invalidation.StreamName(prefix)
	if _, err := ijs.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: invalidation.StreamSubjects(prefix), Storage: jetstream.MemoryStorage, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}

	// The edge's node follows one tag's subject and the heartbeats.
	followed := invalidation.TagSubject(prefix, "public.items(id)=1")
	other := invalidation.TagSubject(prefix, "public.items(id)=2")
	heard := make(chan *nats.Msg, 16)
	for _, subj := range []string{followed, invalidation.HeartbeatSubject(prefix)} {
		if _, err := node.ChanSubscribe(subj, heard); err != nil {
			t.Fatal(err)
		}
	}
	if err := node.Flush(); err != nil {
		t.Fatal(err)
	}
	// The subscription's interest reaches the hub asynchronously: publish
	// until the first message arrives.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := ijs.Publish(ctx, followed, []byte("first")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-heard:
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("an invalidation published at the hub never reached the leaf's subscriber")
			}
			continue
		}
		break
	}
	time.Sleep(100 * time.Millisecond)
	for len(heard) > 0 {
		<-heard
	}
	before := leafInMsgs(t, leaf)
	for range 20 {
		if _, err := ijs.Publish(ctx, other, []byte("not followed")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ijs.Publish(ctx, followed, []byte("invalidation")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-heard:
		if m.Subject != followed || string(m.Data) != "invalidation" {
			t.Fatalf("heard %s %q", m.Subject, m.Data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the invalidation published at the hub did not reach the leaf's subscriber")
	}
	if got := leafInMsgs(t, leaf) - before; got != 1 {
		t.Errorf("the leaf received %d messages for 1 followed and 20 others: not interest-based", got)
	}

	// The client's request crosses to the invalidator and back.
	if _, err := inv.Subscribe(invalidation.TagSetsSubject(prefix), func(m *nats.Msg) { _ = m.Respond([]byte("tagsets")) }); err != nil {
		t.Fatal(err)
	}
	_ = inv.Flush()
	var reply *nats.Msg
	for deadline := time.Now().Add(10 * time.Second); ; {
		if reply, err = client.Request(invalidation.TagSetsSubject(prefix), nil, time.Second); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || string(reply.Data) != "tagsets" {
		t.Fatalf("the client's request through the leaf: %v", err)
	}

	// The node reads the hub's stream through the leaf (stream info, an
	// ordered consumer, a direct get).
	njs, err := jetstream.New(node)
	if err != nil {
		t.Fatal(err)
	}
	s, err := njs.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("the node's stream info through the leaf: %v", err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, followed); err != nil {
		t.Fatalf("the node's direct get through the leaf: %v", err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{followed}})
	if err != nil {
		t.Fatalf("the node's ordered consumer through the leaf: %v", err)
	}
	if m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil || m.Subject() != followed {
		t.Fatalf("the node's replay through the leaf: %v", err)
	}

	// A leaf that admits anyone at the edge: what is published there
	// under the prefix still stops at the hub (the leaf role may not
	// publish it).
	openCfg := DefaultNATSConfig(dir + "/open")
	openCfg.Leaf = &NATSLeaf{URL: hub.LeafURL(), Seed: roles.Seeds[invalidation.RoleLeaf]}
	open, err := StartNATS(ctx, openCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.WaitLeaf(ctx); err != nil {
		t.Fatal(err)
	}
	hubHeard := make(chan *nats.Msg, 4)
	if _, err := inv.ChanSubscribe(invalidation.HeartbeatSubject(prefix), hubHeard); err != nil {
		t.Fatal(err)
	}
	_ = inv.Flush()
	anyone, err := nats.Connect(open.URL(), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer anyone.Close()
	time.Sleep(200 * time.Millisecond) // the hub's interest reaches the leaf
	for range 3 {
		_ = anyone.Publish(invalidation.HeartbeatSubject(prefix), []byte("forged"))
	}
	_ = anyone.Flush()
	select {
	case m := <-hubHeard:
		t.Fatalf("a message published at an edge reached the hub on %s", m.Subject)
	case <-time.After(time.Second):
	}
}

// leafInMsgs is what an embedded leaf received from its hub.
func leafInMsgs(t *testing.T, leaf *NATS) int64 {
	t.Helper()
	r, err := leaf.embedded.Leafz(&server.LeafzOptions{})
	if err != nil || len(r.Leafs) == 0 {
		t.Fatalf("leafz: %v", err)
	}
	var n int64
	for _, l := range r.Leafs {
		n += l.InMsgs
	}
	return n
}
