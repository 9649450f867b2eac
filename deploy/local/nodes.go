package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/overlay"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
)

// stackNode is one of the stack's cache-nodes.
type stackNode struct {
	stop        context.CancelFunc
	done        chan error
	addr        string // protocol
	metricsAddr string // "" for none
	ov          *overlay.Overlay
}

// overlayFiles are the overlay's secrets in Dir/secrets: the pre-shared
// network key (new at every start, as the other credentials), one
// identity per node (kept across starts: the peer IDs stay) and the
// allow-list naming them all.
type overlayFiles struct {
	psk   string
	keys  []string
	allow []peer.ID
}

func newOverlayFiles(dir string, n int) (overlayFiles, error) {
	f := overlayFiles{psk: filepath.Join(dir, "overlay-swarm.key")}
	if err := os.Remove(f.psk); err != nil && !errors.Is(err, os.ErrNotExist) {
		return f, err
	}
	if _, err := overlay.WritePSK(f.psk); err != nil {
		return f, err
	}
	var list strings.Builder
	list.WriteString("# the local stack's cache-nodes (cache-node --p2p-allow)\n")
	for i := range n {
		key := filepath.Join(dir, fmt.Sprintf("cache-node-%d.p2p.key", i+1))
		k, err := overlay.LoadOrCreateIdentity(key)
		if err != nil {
			return f, err
		}
		id, err := peer.IDFromPrivateKey(k)
		if err != nil {
			return f, err
		}
		f.keys, f.allow = append(f.keys, key), append(f.allow, id)
		fmt.Fprintln(&list, id)
	}
	return f, os.WriteFile(filepath.Join(dir, "overlay-members.txt"), []byte(list.String()), 0o644)
}

// nthAddr is the i-th node's address from the first's: host:port+i, or
// host:0 (a free port) for each when the port is 0; "" stays "".
func nthAddr(addr string, i int) (string, error) {
	if addr == "" || i == 0 {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("port of %q: %w", addr, err)
	}
	if p != 0 {
		p += i
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// startCacheNodes runs cfg.CacheNodes cache-nodes (memory backend) in this
// process. More than one join an overlay through the first; the start
// waits until every node sees every other, so that LARDER_DSN forwards
// from its first request.
func (s *Stack) startCacheNodes(cfg Config) error {
	n := max(cfg.CacheNodes, 1)
	var ovFiles overlayFiles
	if n > 1 {
		var err error
		if ovFiles, err = newOverlayFiles(s.Creds.Dir, n); err != nil {
			return fmt.Errorf("overlay credentials: %w", err)
		}
	}
	var boot []peer.AddrInfo
	for i := range n {
		node, err := s.startCacheNode(cfg, i, ovFiles, boot)
		if err != nil {
			return err
		}
		s.nodes = append(s.nodes, node)
		if i == 0 && node.ov != nil {
			boot = []peer.AddrInfo{{ID: node.ov.ID(), Addrs: node.ov.Host().Addrs()}}
		}
	}
	// Standalone nodes follow, on the next ports: not members of the
	// overlay, each caching alone.
	for j := range cfg.StandaloneCacheNodes {
		node, err := s.startCacheNode(cfg, n+j, overlayFiles{}, nil)
		if err != nil {
			return err
		}
		s.standalone = append(s.standalone, node)
	}
	if n == 1 {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range s.nodes {
		for len(node.ov.Members()) < n {
			if time.Now().After(deadline) {
				return fmt.Errorf("the cache-nodes did not all join the overlay within 30 s (the node on %s sees %d of %d)", node.addr, len(node.ov.Members()), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// startCacheNode runs the i-th cache-node; with overlay files, as a
// member of the overlay, joining through boot.
func (s *Stack) startCacheNode(cfg Config, i int, ovFiles overlayFiles, boot []peer.AddrInfo) (*stackNode, error) {
	logName := "cache-node.log"
	if i > 0 {
		logName = fmt.Sprintf("cache-node-%d.log", i+1)
	}
	log, err := s.logger(cfg, logName)
	if err != nil {
		return nil, err
	}
	budget := cfg.CacheNodeMemory
	if budget <= 0 {
		budget = 256 << 20
	}
	listen, err := nthAddr(fmt.Sprintf("127.0.0.1:%d", cfg.CacheNodePort), i)
	if err != nil {
		return nil, err
	}
	o := daemon.Options{Listen: listen, NATS: s.NATS.URL(), Store: "memory", Memory: budget, BroadcastInvalidation: cfg.BroadcastInvalidation}
	metrics, err := nthAddr(cfg.CacheNodeMetrics, i)
	if err != nil {
		return nil, fmt.Errorf("metrics address: %w", err)
	}
	if o.TLS, err = pki.ServerTLS(s.Creds.NodeCert, s.Creds.NodeKey, s.Creds.CA); err != nil {
		return nil, err
	}
	if o.NATSOptions, err = s.Creds.natsOptions(invalidation.RoleCacheNode); err != nil {
		return nil, err
	}
	node := &stackNode{done: make(chan error, 1)}
	if ovFiles.keys != nil {
		psk, err := overlay.ReadPSK(ovFiles.psk)
		if err != nil {
			return nil, err
		}
		o.Overlay = &overlay.Config{Listen: []string{"127.0.0.1:0"}, KeyFile: ovFiles.keys[i], PSK: psk, Allow: ovFiles.allow, Bootstrap: boot,
			AddedLatency: cfg.OverlayLatency}
		o.OverlayStarted = func(ov *overlay.Overlay) { node.ov = ov }
	}
	// Bound until the node serves on it (daemon.Run closes it).
	if o.MetricsListener, err = listenMetrics(metrics); err != nil {
		return nil, err
	}
	if o.MetricsListener != nil {
		o.Metrics = o.MetricsListener.Addr().String()
		node.metricsAddr = o.Metrics
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	node.stop = cancel
	go func() { node.done <- daemon.Run(ctx, o, log, ready) }()
	select {
	case node.addr = <-ready:
		return node, nil
	case err := <-node.done:
		cancel()
		return nil, err
	}
}

// CacheNodeAddrs are where the cache-nodes serve their protocol, the
// first (the home node of LARDER_DSN) first.
func (s *Stack) CacheNodeAddrs() []string {
	addrs := make([]string, len(s.nodes))
	for i, n := range s.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// StandaloneNodeAddrs are where the standalone cache-nodes
// (Config.StandaloneCacheNodes) serve their protocol.
func (s *Stack) StandaloneNodeAddrs() []string {
	addrs := make([]string, len(s.standalone))
	for i, n := range s.standalone {
		addrs[i] = n.addr
	}
	return addrs
}

// metricsURLs are the /metrics endpoints of nodes ("" for none).
func metricsURLs(nodes []*stackNode) string {
	var metrics []string
	for _, n := range nodes {
		if n.metricsAddr != "" {
			metrics = append(metrics, "http://"+n.metricsAddr+"/metrics")
		}
	}
	return strings.Join(metrics, ",")
}

// stopCacheNodes stops every cache-node.
func (s *Stack) stopCacheNodes() []error {
	var errs []error
	for i, n := range append(slices.Clone(s.nodes), s.standalone...) {
		n.stop()
		if err := <-n.done; err != nil {
			errs = append(errs, fmt.Errorf("cache-node %d: %w", i+1, err))
		}
	}
	return errs
}
