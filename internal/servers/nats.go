package servers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATSConfig configures a NATS server with JetStream started by StartNATS.
type NATSConfig struct {
	// Dir holds the JetStream store (Dir/jetstream) and, for a binary, its log.
	Dir string
	// Port on 127.0.0.1; 0 picks a free one.
	Port int
	// Bin, when set, runs that nats-server binary as a child process (as a
	// deployment would): a path, or a name looked up on $PATH and in the Go
	// bin directory. Empty embeds the server in this process, which is what
	// tests and the embedded default use.
	Bin string
	// StartTimeout bounds start-up.
	StartTimeout time.Duration
	// Users, when set, are the only users the server admits: each
	// authenticates with its nkey and may use only the subjects its
	// permissions allow. Empty admits anyone (tests of other things).
	Users []NATSUser
	// LeafPort, when positive, makes the server a hub: it accepts leaf
	// node connections on 127.0.0.1:LeafPort. A leaf authenticates as one
	// of Users (invalidation.RoleLeaf), whose permissions bound what
	// crosses, as seen from the leaf.
	LeafPort int
	// Leaf, when set, makes the server a leaf node of a hub (embedded
	// only): it runs without JetStream (its clients' JetStream requests go
	// to the hub's) and only the subjects its clients subscribe to cross
	// from the hub (interest-based). Its own clients authenticate as
	// Users.
	Leaf *NATSLeaf
}

// NATSLeaf is a leaf node's connection to its hub.
type NATSLeaf struct {
	// URL is the hub's leaf node address (nats-leaf://host:port or
	// nats://host:port).
	URL string
	// Seed is the file holding the nkey seed the leaf authenticates with
	// (the hub's RoleLeaf user); empty for a hub without users.
	Seed string
}

// NATSUser is a NATS user that authenticates with an nkey (the public
// key, "U…"; the user holds the seed) and its subject permissions.
type NATSUser struct {
	Nkey                          string
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
	// AllowResponses lets the user answer requests it receives (one
	// answer per request, within two minutes).
	AllowResponses bool
}

func (u NATSUser) permissions() *server.Permissions {
	p := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: u.PublishAllow, Deny: u.PublishDeny},
		Subscribe: &server.SubjectPermission{Allow: u.SubscribeAllow, Deny: u.SubscribeDeny},
	}
	if u.AllowResponses {
		p.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return p
}

// natsConfigFile is the users' part of a nats-server configuration file
// (JSON is valid NATS configuration syntax).
func natsConfigFile(users []NATSUser, leafPort int) ([]byte, error) {
	type subj struct {
		Allow []string `json:"allow,omitempty"`
		Deny  []string `json:"deny,omitempty"`
	}
	type perms struct {
		Publish        subj `json:"publish"`
		Subscribe      subj `json:"subscribe"`
		AllowResponses bool `json:"allow_responses,omitempty"`
	}
	type user struct {
		Nkey        string `json:"nkey"`
		Permissions perms  `json:"permissions"`
	}
	var us []user
	for _, u := range users {
		us = append(us, user{Nkey: u.Nkey, Permissions: perms{
			Publish: subj{u.PublishAllow, u.PublishDeny}, Subscribe: subj{u.SubscribeAllow, u.SubscribeDeny}, AllowResponses: u.AllowResponses,
		}})
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // nats-server reads no \u escapes; subjects hold '>'
	enc.SetIndent("", "  ")
	conf := map[string]any{}
	if len(us) > 0 {
		conf["authorization"] = map[string]any{"users": us}
	}
	if leafPort > 0 {
		conf["leafnodes"] = map[string]any{"listen": "127.0.0.1:" + strconv.Itoa(leafPort)}
		conf["default_js_domain"] = map[string]string{server.DEFAULT_GLOBAL_ACCOUNT: ""}
	}
	if err := enc.Encode(conf); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// DefaultNATSConfig returns an embedded server with its store in dir on a free port.
func DefaultNATSConfig(dir string) NATSConfig {
	return NATSConfig{Dir: dir, StartTimeout: 20 * time.Second}
}

// Validate reports a config that cannot work.
func (c NATSConfig) Validate() error {
	if c.Dir == "" {
		return errors.New("larder/servers: nats: Dir is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("larder/servers: nats: bad port %d", c.Port)
	}
	if c.StartTimeout <= 0 {
		return errors.New("larder/servers: nats: StartTimeout must be positive")
	}
	if c.LeafPort < 0 || c.LeafPort > 65535 {
		return fmt.Errorf("larder/servers: nats: bad leaf port %d", c.LeafPort)
	}
	if c.Leaf != nil && c.Bin != "" {
		return errors.New("larder/servers: nats: a leaf node runs embedded only")
	}
	if c.Leaf != nil && c.Leaf.URL == "" {
		return errors.New("larder/servers: nats: a leaf node needs its hub's URL")
	}
	return nil
}

// NATS is a running NATS server with JetStream enabled. Safe for concurrent use.
type NATS struct {
	port     int
	leafPort int
	auth     bool           // users are required: ping expects to be refused
	embedded *server.Server // nil when running a binary
	proc     *process       // nil when embedded

	closeOnce sync.Once
	closeErr  error
}

// NATSInstallHint says how to install the standalone nats-server binary.
const NATSInstallHint = "go install github.com/nats-io/nats-server/v2@v2.15.2 (or run `make deps`)"

// StartNATS starts NATS with JetStream and returns once it accepts clients.
func StartNATS(ctx context.Context, cfg NATSConfig) (*NATS, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	store := filepath.Join(dir, "jetstream")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, fmt.Errorf("larder/servers: nats store: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if cfg.Bin == "" {
		return startEmbeddedNATS(ctx, cfg, store)
	}
	bin, err := findBinary(cfg.Bin, "nats-server", goBinDirs(), NATSInstallHint)
	if err != nil {
		return nil, err
	}
	n := &NATS{auth: len(cfg.Users) > 0, leafPort: cfg.LeafPort}
	const attempts = 3
	for attempt := 1; ; attempt++ {
		n.port = cfg.Port
		if n.port == 0 {
			if n.port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-js", "-sd", store}
		if port := os.Getenv("LARDER_NATS_PROFILE_PORT"); port != "" {
			// nats-server's own Go profiles, at http://127.0.0.1:port/debug/pprof/.
			args = append(args, "--profile", port)
		}
		if len(cfg.Users) > 0 || cfg.LeafPort > 0 {
			conf, err := natsConfigFile(cfg.Users, cfg.LeafPort)
			if err != nil {
				return nil, err
			}
			path := filepath.Join(dir, "nats.conf")
			if err := os.WriteFile(path, conf, 0o600); err != nil {
				return nil, fmt.Errorf("larder/servers: nats config: %w", err)
			}
			args = append(args, "-c", path)
		}
		n.proc, err = startProcess("nats-server", bin, args, filepath.Join(dir, "nats.log"), nil, syscall.SIGTERM)
		if err != nil {
			return nil, err
		}
		err = waitReady(ctx, n.proc, n.ping)
		if err == nil {
			return n, nil
		}
		_ = n.proc.stop()
		if cfg.Port != 0 || attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
	}
}

func startEmbeddedNATS(ctx context.Context, cfg NATSConfig, store string) (*NATS, error) {
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "larder-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  cfg.Leaf == nil,
		StoreDir:   store,
		NoLog:      true,
		NoSigs:     true,
		// Invalidations are small; the default 1 MiB payload limit is kept.
	}
	if cfg.LeafPort > 0 || cfg.Leaf != nil {
		// The hub's JetStream serves its leaves' clients (the edge's
		// cache-nodes read the invalidation stream through the leaf) on the
		// plain $JS.API subjects: the global account's JetStream has the
		// default, empty, domain on both sides, so the leaf connection does
		// not deny JetStream API traffic.
		opts.JsAccDefaultDomain = map[string]string{server.DEFAULT_GLOBAL_ACCOUNT: ""}
	}
	if cfg.LeafPort > 0 {
		opts.LeafNode.Host, opts.LeafNode.Port = "127.0.0.1", cfg.LeafPort
	}
	if cfg.Leaf != nil {
		opts.ServerName = "larder-embedded-leaf"
		remote, err := leafRemote(*cfg.Leaf)
		if err != nil {
			return nil, err
		}
		opts.LeafNode.Remotes = []*server.RemoteLeafOpts{remote}
		opts.LeafNode.ReconnectInterval = 250 * time.Millisecond
	}
	for _, u := range cfg.Users {
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.Nkey, Permissions: u.permissions()})
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("larder/servers: nats: %w", err)
	}
	go s.Start()
	deadline, _ := ctx.Deadline()
	if !s.ReadyForConnections(time.Until(deadline)) {
		s.Shutdown()
		return nil, fmt.Errorf("%w: embedded nats-server", ErrNotReady)
	}
	tcp, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		s.Shutdown()
		return nil, fmt.Errorf("larder/servers: nats: unexpected listen address %v", s.Addr())
	}
	n := &NATS{embedded: s, port: tcp.Port, auth: len(cfg.Users) > 0, leafPort: cfg.LeafPort}
	if err := waitReady(ctx, nil, n.ping); err != nil {
		s.Shutdown()
		return nil, err
	}
	return n, nil
}

func (n *NATS) ping(ctx context.Context) error {
	nc, err := nats.Connect(n.URL(), nats.Timeout(time.Second), nats.NoReconnect())
	if n.auth && errors.Is(err, nats.ErrAuthorization) {
		return nil // the server answered: it is up, and refuses strangers
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	return nc.FlushWithContext(ctx)
}

// URL is the client URL of the server.
func (n *NATS) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// Port is the client port.
func (n *NATS) Port() int { return n.port }

// LeafURL is where a hub accepts leaf nodes ("" unless Config.LeafPort).
func (n *NATS) LeafURL() string {
	if n.leafPort <= 0 {
		return ""
	}
	return "nats-leaf://127.0.0.1:" + strconv.Itoa(n.leafPort)
}

// LeafNodes is the number of leaf node connections of an embedded server
// (a leaf's to its hub, a hub's from its leaves); -1 for a binary.
func (n *NATS) LeafNodes() int {
	if n.embedded == nil {
		return -1
	}
	return n.embedded.NumLeafNodes()
}

// WaitLeaf waits until an embedded server has a leaf node connection.
func (n *NATS) WaitLeaf(ctx context.Context) error {
	for n.LeafNodes() < 1 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("larder/servers: nats: no leaf node connection: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// leafRemote is a leaf's remote: the hub's URL and its nkey.
func leafRemote(l NATSLeaf) (*server.RemoteLeafOpts, error) {
	u, err := url.Parse(l.URL)
	if err != nil {
		return nil, fmt.Errorf("larder/servers: nats: the hub's URL: %w", err)
	}
	r := &server.RemoteLeafOpts{URLs: []*url.URL{u}, DialTimeout: 5 * time.Second, FirstInfoTimeout: 5 * time.Second}
	if l.Seed != "" {
		seed, err := os.ReadFile(l.Seed)
		if err != nil {
			return nil, fmt.Errorf("larder/servers: nats: the leaf's nkey: %w", err)
		}
		r.Nkey = string(bytes.TrimSpace(seed))
	}
	return r, nil
}

// Close shuts the server down and waits for it. Idempotent.
func (n *NATS) Close() error {
	n.closeOnce.Do(func() {
		if n.embedded != nil {
			n.embedded.Shutdown()
			n.embedded.WaitForShutdown()
			return
		}
		n.closeErr = n.proc.stop()
	})
	return n.closeErr
}
