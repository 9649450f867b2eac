package servers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/larderdb/larder/internal/invalidation"
)

// TestNATSRolesEnforced starts NATS with the roles' users (embedded, and
// the nats-server binary a deployment runs) and checks what each role
// may do: strangers are refused; a client or a cache-node cannot publish
// pins, heartbeats or invalidations, nor answer the invalidator's
// requests, nor touch the stream; the invalidator can do all of it.
func TestNATSRolesEnforced(t *testing.T) {
	for _, bin := range []string{"", "nats-server"} {
		name := "embedded"
		if bin != "" {
			name = "binary"
		}
		t.Run(name, func(t *testing.T) { testNATSRoles(t, bin) })
	}
}

func testNATSRoles(t *testing.T, bin string) {
	const prefix = "larder"
	dir := t.TempDir()
	roles, err := NewNATSRoles(dir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultNATSConfig(dir)
	cfg.Bin, cfg.Users = bin, roles.Users
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := StartNATS(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	if nc, err := nats.Connect(srv.URL(), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a connection without credentials: %v, want an authorization violation", err)
	}

	// Permission violations arrive asynchronously on the connection.
	violations := map[invalidation.Role]chan error{}
	connect := func(role invalidation.Role) *nats.Conn {
		opt, err := nats.NkeyOptionFromSeed(roles.Seeds[role])
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 64)
		violations[role] = ch
		nc, err := nats.Connect(srv.URL(), opt, nats.NoReconnect(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case ch <- err:
			default:
			}
		}))
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	inv, node, client := connect(invalidation.RoleInvalidator), connect(invalidation.RoleCacheNode), connect(invalidation.RoleClient)
	wantViolation := func(role invalidation.Role, what string) {
		t.Helper()
		select {
		case err := <-violations[role]:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("%s %s: %v, want a permissions violation", role, what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s %s: no permissions violation reported", role, what)
		}
	}

	// The invalidator's stream, made with its own credentials.
	js, err := jetstream.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	stream := invalidation.StreamName(prefix)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: invalidation.StreamSubjects(prefix), Storage: jetstream.MemoryStorage, AllowDirect: true}); err != nil {
		t.Fatalf("invalidator creates its stream: %v", err)
	}

	// What a node and a client hear: everything under the prefix.
	heard := make(chan *nats.Msg, 64)
	if _, err := node.ChanSubscribe(prefix+".>", heard); err != nil {
		t.Fatal(err)
	}
	if err := node.Flush(); err != nil {
		t.Fatal(err)
	}
	forged := []string{invalidation.PinAnnounceSubject(prefix), invalidation.HeartbeatSubject(prefix), invalidation.TagSubject(prefix, "public.accounts"), invalidation.SchemaChangedSubject(prefix)}
	for _, subj := range forged {
		for _, role := range []invalidation.Role{invalidation.RoleClient, invalidation.RoleCacheNode} {
			nc := map[invalidation.Role]*nats.Conn{invalidation.RoleClient: client, invalidation.RoleCacheNode: node}[role]
			if err := nc.Publish(subj, []byte("forged")); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			wantViolation(role, "publishing "+subj)
		}
	}
	// The invalidator's own message arrives; none of the forged ones did.
	// It publishes through JetStream, as the invalidator does: the stream
	// holds the message once the publish returns (the direct gets below
	// read it).
	invJS, err := jetstream.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := invJS.Publish(ctx, invalidation.HeartbeatSubject(prefix), []byte("genuine")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-heard:
		if string(m.Data) != "genuine" {
			t.Fatalf("a node heard a forged message on %s", m.Subject)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the invalidator's heartbeat did not arrive")
	}

	// Only the invalidator answers requests; a client asks.
	if _, err := inv.Subscribe(invalidation.PinListSubject(prefix), func(m *nats.Msg) { _ = m.Respond([]byte("pins")) }); err != nil {
		t.Fatal(err)
	}
	_ = inv.Flush()
	reply, err := client.Request(invalidation.PinListSubject(prefix), nil, 5*time.Second)
	if err != nil || string(reply.Data) != "pins" {
		t.Fatalf("client request: %v %v", reply, err)
	}
	if _, err := client.Subscribe(invalidation.PinVerifySubject(prefix), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = client.Flush()
	wantViolation(invalidation.RoleClient, "subscribing to the verify requests")
	if err := client.Publish("_INBOX.someone", []byte("forged answer")); err != nil {
		t.Fatal(err)
	}
	_ = client.Flush()
	wantViolation(invalidation.RoleClient, "publishing to an inbox")

	// A node, and a client (its L1 follows the stream as a node does),
	// read the stream but cannot change it.
	for role, nc := range map[invalidation.Role]*nats.Conn{invalidation.RoleCacheNode: node, invalidation.RoleClient: client} {
		rjs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := rjs.Stream(ctx, stream)
		if err != nil {
			t.Fatalf("%s reads the stream's info: %v", role, err)
		}
		if _, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{}); err != nil {
			t.Fatalf("%s makes an ordered consumer: %v", role, err)
		}
		// The last messages of many subjects at once (a direct get), as a
		// node confirms new groups.
		msgs, err := jetstreamext.GetLastMsgsFor(ctx, rjs, stream, []string{invalidation.HeartbeatSubject(prefix)})
		if err != nil {
			t.Fatalf("%s's direct get: %v", role, err)
		}
		for m, err := range msgs {
			if err != nil || string(m.Data) != "genuine" {
				t.Fatalf("%s's direct get: %v %v", role, m, err)
			}
		}
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		if err := rjs.DeleteStream(dctx, stream); err == nil {
			t.Fatalf("a %s deleted the invalidation stream", role)
		}
		if _, err := rjs.Publish(dctx, invalidation.HeartbeatSubject(prefix), []byte("forged")); err == nil {
			t.Fatalf("a %s published into the invalidation stream", role)
		}
		dcancel()
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	// The stream holds the invalidator's heartbeat only.
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream after the forged publishes: %v messages (want the 1 genuine), %v", info.State.Msgs, err)
	}
}
