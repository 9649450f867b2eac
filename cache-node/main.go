package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/overlay"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/bytesize"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
	"github.com/larderdb/larder/internal/secret"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

type options struct {
	listen, natsURL, prefix, store, metrics, logLevel string
	memory                                            int64
	maxFrame                                          int
	// TLS of the protocol (mutual: clients present certificates signed
	// by tlsClientCA), or insecure plain TCP when asked for explicitly.
	tlsCert, tlsKey, tlsClientCA string
	insecure                     bool
	natsNkey                     string // seed file of the node's NATS user
	redisPasswordFile            string
	// the protocol server's limits
	maxInFlight                            int64
	maxConns                               int
	idleTimeout, readTimeout, writeTimeout time.Duration
	// the libp2p overlay (off without p2pListen)
	p2pListen, p2pKey, p2pPSK, p2pAllow, p2pBootstrap string
	p2pInsecure, p2pShowID                            bool
	p2pTimeout                                        time.Duration
	loadLease                                         time.Duration
	watermarkWait                                     time.Duration
	linger                                            time.Duration
	broadcast                                         bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	var memory string
	fs := flag.NewFlagSet("cache-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7070", "address to serve the cache-node protocol on")
	fs.StringVar(&o.natsURL, "nats", envOr("LARDER_NATS_URL", nats.DefaultURL), "NATS URL (env LARDER_NATS_URL)")
	fs.StringVar(&o.prefix, "prefix", invalidation.DefaultPrefix, "NATS subject prefix (the invalidator's)")
	fs.StringVar(&o.store, "store", "memory", `"memory", or a Redis URL (redis://host:port/db) to front`)
	fs.StringVar(&memory, "memory", "256MiB", "byte budget: a number with an optional KiB, MiB or GiB suffix; with redis, the budget the node expects: the Redis's maxmemory (the operator's setting) enforces it, and the node warns if they differ")
	fs.StringVar(&o.metrics, "metrics", "127.0.0.1:9189", "address of the Prometheus /metrics endpoint (empty: none)")
	fs.IntVar(&o.maxFrame, "max-frame", protocol.DefaultMaxFrame, "largest request or answer frame, bytes")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.tlsCert, "tls-cert", os.Getenv("LARDER_NODE_TLS_CERT"), "the node's certificate, PEM (env LARDER_NODE_TLS_CERT)")
	fs.StringVar(&o.tlsKey, "tls-key", os.Getenv("LARDER_NODE_TLS_KEY"), "the node's private key, PEM (env LARDER_NODE_TLS_KEY)")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", os.Getenv("LARDER_NODE_TLS_CLIENT_CA"), "CA that signs the clients' certificates; peers without one are refused (env LARDER_NODE_TLS_CLIENT_CA)")
	fs.BoolVar(&o.insecure, "insecure-no-auth", false, "serve plain TCP to anyone who can reach --listen (anyone can then read and forge cached results)")
	fs.StringVar(&o.natsNkey, "nats-nkey", os.Getenv("LARDER_NATS_NKEY"), "file holding the node's NATS nkey seed (env LARDER_NATS_NKEY)")
	maxInFlight := fs.String("max-in-flight", "256MiB", "request bytes being received at once, over all connections; a frame beyond it waits, then is answered \"node busy\"")
	fs.IntVar(&o.maxConns, "max-conns", 4096, "open connections; more are closed at once (counted in larder_node_conns_refused_total)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 5*time.Minute, "a connection idle this long between requests is closed (keep above the clients' 1 min pool idle)")
	fs.DurationVar(&o.readTimeout, "read-timeout", 30*time.Second, "time to receive a whole frame once its first byte arrived, and to finish the TLS handshake")
	fs.DurationVar(&o.writeTimeout, "write-timeout", 30*time.Second, "time to send an answer")
	fs.StringVar(&o.redisPasswordFile, "redis-password-file", os.Getenv("LARDER_REDIS_PASSWORD_FILE"), "file holding the Redis password, so that --store need not carry it (env LARDER_REDIS_PASSWORD_FILE)")
	fs.StringVar(&o.p2pListen, "p2p-listen", "", "join the libp2p overlay, listening on these TCP addresses (comma-separated multiaddrs or host:port); keys another member masters are then forwarded to it (empty: no overlay)")
	fs.StringVar(&o.p2pKey, "p2p-key", os.Getenv("LARDER_NODE_P2P_KEY"), "file of the node's Ed25519 libp2p identity, made (mode 0600) on first start (env LARDER_NODE_P2P_KEY)")
	fs.StringVar(&o.p2pPSK, "p2p-psk", os.Getenv("LARDER_NODE_P2P_PSK"), "the overlay's pre-shared network key, a /key/swarm/psk/1.0.0/ file (env LARDER_NODE_P2P_PSK)")
	fs.StringVar(&o.p2pAllow, "p2p-allow", os.Getenv("LARDER_NODE_P2P_ALLOW"), "file of the peer IDs admitted to the overlay, one a line (env LARDER_NODE_P2P_ALLOW)")
	fs.StringVar(&o.p2pBootstrap, "p2p-bootstrap", "", "members to join through: comma-separated multiaddrs ending in /p2p/PEER-ID")
	fs.BoolVar(&o.p2pInsecure, "p2p-insecure-open", false, "run the overlay without --p2p-psk or --p2p-allow (whoever can reach it can join and serve forged results to every member)")
	fs.DurationVar(&o.p2pTimeout, "p2p-timeout", 2*time.Second, "deadline of a request forwarded to a key's master")
	fs.BoolVar(&o.p2pShowID, "p2p-show-id", false, "print the peer ID of --p2p-key (making the key if there is none) and exit")
	fs.DurationVar(&o.linger, "linger", node.DefaultLinger, "how long the node stays subscribed to a tag's group after the last version depending on it settled, so that the key's next version is served at once (0: not at all)")
	fs.DurationVar(&o.watermarkWait, "watermark-wait", node.DefaultWatermarkWait, "how long a lookup whose snapshot is newer than the node's watermark waits for the next heartbeat when the key holds a version that would then serve it, rather than missing (0: never)")
	fs.DurationVar(&o.loadLease, "load-lease", node.DefaultLoadLease, "how long a lookup that misses makes other clients' lookups of the key wait for its requester's put, when they ask to wait (stampede control; 0: none)")
	fs.BoolVar(&o.broadcast, "broadcast-invalidation", false, "receive every invalidation of every table (one wildcard subscription) and drop those of groups the node does not follow, instead of subscribing to its groups: the broadcast ablation, for comparing with pub/sub")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.p2pShowID {
		if o.p2pKey == "" {
			return o, errors.New("--p2p-show-id needs --p2p-key")
		}
		return o, nil
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var err error
	if o.memory, err = parseBytes(memory); err != nil {
		return o, fmt.Errorf("--memory: %w", err)
	}
	if o.maxInFlight, err = parseBytes(*maxInFlight); err != nil {
		return o, fmt.Errorf("--max-in-flight: %w", err)
	}
	if o.maxConns < 1 {
		return o, errors.New("--max-conns must be at least 1")
	}
	for name, d := range map[string]time.Duration{"--idle-timeout": o.idleTimeout, "--read-timeout": o.readTimeout, "--write-timeout": o.writeTimeout} {
		if d <= 0 {
			return o, fmt.Errorf("%s must be positive", name)
		}
	}
	if err := invalidation.ValidPrefix(o.prefix); err != nil {
		return o, err
	}
	if o.store != "memory" && !strings.HasPrefix(o.store, "redis://") && !strings.HasPrefix(o.store, "rediss://") {
		return o, fmt.Errorf("--store %q: want memory or a redis:// URL", o.store)
	}
	if o.maxFrame < 1<<10 {
		return o, errors.New("--max-frame must be at least 1KiB")
	}
	tlsSet := o.tlsCert != "" || o.tlsKey != "" || o.tlsClientCA != ""
	switch {
	case tlsSet && o.insecure:
		return o, errors.New("--insecure-no-auth and --tls-* contradict each other")
	case tlsSet && (o.tlsCert == "" || o.tlsKey == "" || o.tlsClientCA == ""):
		return o, errors.New("TLS needs all of --tls-cert, --tls-key and --tls-client-ca")
	case !tlsSet && !o.insecure:
		return o, errors.New("the protocol must be authenticated: give --tls-cert, --tls-key and --tls-client-ca (mutual TLS), or --insecure-no-auth to serve anyone who can connect")
	}
	if o.redisPasswordFile != "" && o.store == "memory" {
		return o, errors.New("--redis-password-file needs a redis:// --store")
	}
	return o, o.checkOverlayFlags()
}

// checkOverlayFlags: the overlay is off without --p2p-listen; with it, it
// needs an identity and, unless --p2p-insecure-open, both the pre-shared
// key and the allow-list.
func (o *options) checkOverlayFlags() error {
	if o.p2pListen == "" {
		if o.p2pPSK != "" || o.p2pAllow != "" || o.p2pBootstrap != "" || o.p2pInsecure {
			return errors.New("--p2p-psk, --p2p-allow, --p2p-bootstrap and --p2p-insecure-open need --p2p-listen")
		}
		return nil
	}
	if o.p2pKey == "" {
		return errors.New("--p2p-listen needs --p2p-key (the node's identity file, made on first start)")
	}
	if o.p2pTimeout <= 0 {
		return errors.New("--p2p-timeout must be positive")
	}
	full := o.p2pPSK != "" && o.p2pAllow != ""
	switch {
	case full && o.p2pInsecure:
		return errors.New("--p2p-insecure-open and --p2p-psk with --p2p-allow contradict each other")
	case !full && !o.p2pInsecure:
		return errors.New("the overlay must be authenticated: give --p2p-psk (the pre-shared network key) and --p2p-allow (the members' peer IDs), or --p2p-insecure-open to let in whoever can connect")
	}
	return nil
}

func parseBytes(s string) (int64, error) {
	n, err := bytesize.Parse(s)
	if err == nil && n == 0 {
		err = fmt.Errorf("%q is not a positive size", s)
	}
	return n, err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "cache-node:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "cache-node: --log-level:", err)
		return 2
	}
	if o.p2pShowID {
		return showPeerID(o.p2pKey, os.Stdout, stderr)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	do, err := o.daemon()
	if err != nil {
		fmt.Fprintln(stderr, "cache-node:", err)
		return 2
	}
	if o.p2pInsecure {
		log.Warn("the overlay runs without full admission (--p2p-insecure-open): whoever can reach it can join, master keys and serve forged results to every member",
			"p2p_listen", o.p2pListen, "psk", o.p2pPSK != "", "allow_list", o.p2pAllow != "")
	}
	if o.insecure {
		log.Warn("serving without authentication (--insecure-no-auth): anyone who can connect can read and forge cached results", "listen", o.listen)
	}
	if o.store == "memory" && os.Getenv("GOMEMLIMIT") == "" {
		limit := daemon.MemoryLimit(o.memory)
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit", "bytes", limit, "budget", o.memory)
	}
	if err := daemon.Run(ctx, do, log, nil); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

func (o options) daemon() (daemon.Options, error) {
	d := daemon.Options{Listen: o.listen, NATS: o.natsURL, Prefix: o.prefix, Store: o.store, Memory: o.memory, Metrics: o.metrics, MaxFrame: o.maxFrame,
		MaxInFlight: o.maxInFlight, MaxConns: o.maxConns, IdleTimeout: o.idleTimeout, ReadTimeout: o.readTimeout, WriteTimeout: o.writeTimeout,
		LoadLease: o.loadLease, WatermarkWait: o.watermarkWait, Linger: o.linger, BroadcastInvalidation: o.broadcast}
	if d.LoadLease == 0 {
		d.LoadLease = -1 // --load-lease 0: none
	}
	if d.WatermarkWait == 0 {
		d.WatermarkWait = -1 // --watermark-wait 0: never
	}
	if d.Linger == 0 {
		d.Linger = -1 // --linger 0: not at all
	}
	if !o.insecure {
		cfg, err := pki.ServerTLS(o.tlsCert, o.tlsKey, o.tlsClientCA)
		if err != nil {
			return d, err
		}
		d.TLS = cfg
	}
	if o.natsNkey != "" {
		opt, err := nats.NkeyOptionFromSeed(o.natsNkey)
		if err != nil {
			return d, fmt.Errorf("--nats-nkey: %w", err)
		}
		d.NATSOptions = append(d.NATSOptions, opt)
	}
	if o.p2pListen != "" {
		ov, err := o.overlayConfig()
		if err != nil {
			return d, err
		}
		d.Overlay = ov
	}
	if o.redisPasswordFile != "" {
		pw, err := secret.FromFile(o.redisPasswordFile)
		if err != nil {
			return d, fmt.Errorf("--redis-password-file: %w", err)
		}
		u, err := url.Parse(o.store)
		if err != nil {
			return d, fmt.Errorf("--store: %s", secret.Redact(err.Error()))
		}
		user := "default"
		if u.User != nil && u.User.Username() != "" {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, pw)
		d.Store = u.String()
	}
	return d, nil
}

// overlayConfig reads the overlay's key files and peers.
func (o options) overlayConfig() (*overlay.Config, error) {
	cfg := &overlay.Config{KeyFile: o.p2pKey, Insecure: o.p2pInsecure, RequestTimeout: o.p2pTimeout, MaxFrame: o.maxFrame}
	for _, a := range strings.Split(o.p2pListen, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Listen = append(cfg.Listen, a)
		}
	}
	var err error
	if o.p2pPSK != "" {
		if cfg.PSK, err = overlay.ReadPSK(o.p2pPSK); err != nil {
			return nil, fmt.Errorf("--p2p-psk: %w", err)
		}
	}
	if o.p2pAllow != "" {
		if cfg.Allow, err = overlay.ReadAllowList(o.p2pAllow); err != nil {
			return nil, fmt.Errorf("--p2p-allow: %w", err)
		}
	}
	if o.p2pBootstrap != "" {
		if cfg.Bootstrap, err = overlay.ParseBootstrap(strings.Split(o.p2pBootstrap, ",")); err != nil {
			return nil, fmt.Errorf("--p2p-bootstrap: %w", err)
		}
	}
	return cfg, nil
}

// showPeerID prints the peer ID of the identity in keyFile, making one if
// there is none: what the other members put on their allow-lists.
func showPeerID(keyFile string, stdout, stderr io.Writer) int {
	k, err := overlay.LoadOrCreateIdentity(keyFile)
	if err == nil {
		var id peer.ID
		if id, err = peer.IDFromPrivateKey(k); err == nil {
			fmt.Fprintln(stdout, id)
			return 0
		}
	}
	fmt.Fprintln(stderr, "cache-node: --p2p-key:", err)
	return 1
}
