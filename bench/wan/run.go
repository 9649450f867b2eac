package wan

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the direct configuration's driver
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/bench/rubis/app"
	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/bench/rubis/mix"
	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/cache-node/origin"
	"github.com/larderdb/larder/cache-node/store"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/pki"
)

// The configurations of the edge application.
const (
	ModeDirect        = "direct"         // pgx over the link
	ModeOriginRows    = "origin-rows"    // Larder, misses through the origin, rows verbatim
	ModeOriginRecipes = "origin-recipes" // Larder, misses through the origin as recipes
)

// Modes are every configuration, in the order they run.
var Modes = []string{ModeDirect, ModeOriginRows, ModeOriginRecipes}

// The page sets.
const (
	MixBrowsing = "browsing" // RUBiS's browsing mix (read-only)
	MixBidding  = "bidding"  // RUBiS's bidding mix (about 15% writes)
	MixListing  = "listing"  // the data-heavy Listing page, a writer bidding meanwhile
)

// Config configures a run of the harness. The database's site (PostgreSQL
// with RUBiS loaded, NATS, the invalidator) runs already.
type Config struct {
	// PGURL is PostgreSQL at the database's site; the origin uses it
	// directly, the edge across the link.
	PGURL string
	// NATSURL is the hub NATS at the database's site; NATSClientSeed and
	// NATSNodeSeed are the nkey seed files of the client and cache-node
	// roles (empty: no credentials).
	NATSURL                      string
	NATSClientSeed, NATSNodeSeed string
	// Leaf, when set, starts the edge's NATS servers: the edge's clients
	// and cache-node connect to a leaf node at the edge, whose leaf
	// connection to the hub (at LeafHubURL, credentials LeafSeed) crosses
	// the link. See LeafConfig.
	Leaf *LeafConfig
	// QUMA is the application's QUMA file.
	QUMA string
	// Size is the loaded data's (for the pages' parameters).
	Size datagen.Size
	// Settings, Modes and Mixes to run (defaults: all).
	Settings []Setting
	Modes    []string
	Mixes    []string
	// VUs are the emulated users; Duration the measured time and Warmup
	// the unmeasured time before it, per mix.
	VUs              int
	Duration, Warmup time.Duration
	// Staleness of the read-only pages (default 30 s).
	Staleness time.Duration
	// BidEvery paces the listing mix's writer (default 250 ms).
	BidEvery time.Duration
	// Dir holds the harness's credentials (default: a temporary folder).
	Dir string
	// Log receives the components' logs (default: none); Progress a line
	// per run (may be nil).
	Log      *slog.Logger
	Progress io.Writer
}

// Run is one measured run.
type Run struct {
	Setting string `json:"setting"`
	Mode    string `json:"mode"`
	Mix     string `json:"mix"`
	VUs     int    `json:"vus"`
	Stats
	// WAN are the bytes each service carried across the link during the
	// measured time, [from the edge, to the edge]; WANBytes their sum.
	WAN      map[string][2]int64 `json:"wan"`
	WANBytes int64               `json:"wan_bytes"`
	// Reads: the client's reads by source (Larder modes).
	Reads map[string]int64 `json:"reads,omitempty"`
	// Origin: what the misses through the origin cost (Larder modes).
	Origin *larder.OriginStats `json:"origin,omitempty"`
}

func (c *Config) defaults() {
	if len(c.Settings) == 0 {
		c.Settings = Settings
	}
	if len(c.Modes) == 0 {
		c.Modes = Modes
	}
	if len(c.Mixes) == 0 {
		c.Mixes = []string{MixBrowsing, MixBidding, MixListing}
	}
	if c.VUs <= 0 {
		c.VUs = 8
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.Staleness <= 0 {
		c.Staleness = 30 * time.Second
	}
	if c.BidEvery <= 0 {
		c.BidEvery = 250 * time.Millisecond
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// harness is what every run shares: the origin next to PostgreSQL and the
// credentials of the edge's cache-node and of the origin.
type harness struct {
	cfg       Config
	dir       string
	ca        string
	serverTLS *tls.Config
	clientTLS [2]string // cert, key
	originSrv *origin.Server
	origin    string
}

// Bench runs every setting, mode and mix of cfg and returns the runs.
func Bench(ctx context.Context, cfg Config) ([]Run, error) {
	cfg.defaults()
	for _, m := range cfg.Modes {
		if !contains(Modes, m) {
			return nil, fmt.Errorf("wan: unknown mode %q", m)
		}
	}
	h := &harness{cfg: cfg, dir: cfg.Dir}
	if h.dir == "" {
		d, err := os.MkdirTemp("", "larder-wan-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		h.dir = d
	}
	if err := h.credentials(); err != nil {
		return nil, err
	}
	stop, err := h.startOrigin(ctx)
	if err != nil {
		return nil, fmt.Errorf("wan: origin: %w", err)
	}
	defer stop()
	var runs []Run
	for _, s := range cfg.Settings {
		for _, mode := range cfg.Modes {
			rs, err := h.runMode(ctx, s, mode)
			if err != nil {
				return runs, fmt.Errorf("wan: %s, %s: %w", s.Name, mode, err)
			}
			runs = append(runs, rs...)
		}
	}
	return runs, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// credentials makes a CA, one server certificate (the edge's cache-node
// and the origin) and the edge client's certificate.
func (h *harness) credentials() error {
	ca, err := pki.NewCA("larder-wan-bench", 24*time.Hour)
	if err != nil {
		return err
	}
	h.ca = filepath.Join(h.dir, "ca.pem")
	if err := os.WriteFile(h.ca, ca.PEM, 0o644); err != nil {
		return err
	}
	srv, err := ca.IssueServer("wan-server", []string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		return err
	}
	cert, key, err := srv.Write(h.dir, "server")
	if err != nil {
		return err
	}
	if h.serverTLS, err = pki.ServerTLS(cert, key, h.ca); err != nil {
		return err
	}
	cl, err := ca.IssueClient("wan-edge", 24*time.Hour)
	if err != nil {
		return err
	}
	h.clientTLS[0], h.clientTLS[1], err = cl.Write(h.dir, "edge")
	return err
}

// startOrigin serves the origin next to PostgreSQL, in this process.
func (h *harness) startOrigin(ctx context.Context) (func(), error) {
	ocfg := origin.DefaultConfig()
	oc, err := larder.OpenPinned(ctx, larder.PoolSized(h.cfg.PGURL, ocfg.MaxSessions), nil)
	if err != nil {
		return nil, err
	}
	ocfg.Log = h.cfg.Log
	srv, err := origin.New(ocfg, oc.OriginBackend(), h.serverTLS)
	if err != nil {
		oc.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		oc.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(context.Background(), ln) }()
	h.originSrv, h.origin = srv, ln.Addr().String()
	return func() { _ = srv.Close(); <-done; oc.Close() }, nil
}

// edge is one configuration's edge site at one link setting.
type edge struct {
	link  *Link
	db    *sql.DB
	dsn   string // the larder DSN ("" for direct)
	base  string // the application's URL
	stops []func()
}

func (e *edge) close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
}

// runMode sets an edge up in mode across a link of s and runs every mix.
func (h *harness) runMode(ctx context.Context, s Setting, mode string) ([]Run, error) {
	e, err := h.startEdge(ctx, s, mode)
	if err != nil {
		return nil, err
	}
	defer e.close()
	var runs []Run
	for _, m := range h.cfg.Mixes {
		r, err := h.runMix(ctx, e, s, mode, m)
		if err != nil {
			return runs, err
		}
		fmt.Fprintf(h.cfg.Progress, "%-12s %-15s %-9s %3d VUs: %8.1f req/s, mean %7.1f ms, p90 %7.1f ms, %6.1f KB/request over the WAN (%d errors)\n",
			s.Name, mode, m, r.VUs, r.Rate, r.MeanMS, r.P90MS, float64(r.WANBytes)/1e3/max(float64(r.Requests), 1), r.Errors)
		runs = append(runs, r)
	}
	return runs, nil
}

func hostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// startEdge starts the link's proxies, the edge's cache-node (Larder
// modes), the database handle and the application.
func (h *harness) startEdge(ctx context.Context, s Setting, mode string) (*edge, error) {
	e := &edge{link: NewLink(s)}
	e.stops = append(e.stops, e.link.Close)
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	pgHost, err := hostPort(h.cfg.PGURL)
	if err != nil {
		return nil, err
	}
	pgWAN, err := e.link.Proxy("postgres", pgHost)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(h.cfg.PGURL)
	u.Host = pgWAN
	edgePG := u.String()
	if mode == ModeDirect {
		if e.db, err = sql.Open("pgx", edgePG); err != nil {
			return nil, err
		}
	} else {
		natsURL, err := h.edgeNATS(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("NATS at the edge: %w", err)
		}
		originWAN, err := e.link.Proxy("origin", h.origin)
		if err != nil {
			return nil, err
		}
		node, err := h.startNode(e, natsURL)
		if err != nil {
			return nil, fmt.Errorf("the edge's cache-node: %w", err)
		}
		q := u.Query()
		q.Set("larder.nats", natsURL)
		if h.cfg.NATSClientSeed != "" {
			q.Set("larder.nats-nkey", h.cfg.NATSClientSeed)
		}
		q.Set("larder.nodes", node)
		q.Set("larder.node-ca", h.ca)
		q.Set("larder.node-cert", h.clientTLS[0])
		q.Set("larder.node-key", h.clientTLS[1])
		q.Set("larder.quma", h.cfg.QUMA)
		q.Set("larder.origin", originWAN)
		q.Set("larder.origin-edge", fmt.Sprintf("%s-%s-%d", s.Name, mode, time.Now().UnixNano()))
		if mode == ModeOriginRows {
			q.Set("larder.origin-rows", "0")
		}
		// Pins and verifications cross a link that may be queueing a
		// bulk transfer: more patience than on a LAN.
		q.Set("larder.pin-verify-timeout", "5s")
		q.Set("larder.pin-silence", "3s")
		// The edge's cache-node is local, but the machine's cores may be
		// shared: a lookup is not given up for a slow scheduler.
		q.Set("larder.node-timeout", "1s")
		q.Set("application_name", "wan-"+s.Name+"-"+mode+"-"+fmt.Sprint(time.Now().UnixNano()))
		u.RawQuery = q.Encode()
		e.dsn = u.String()
		if e.db, err = sql.Open(larder.DriverName, e.dsn); err != nil {
			return nil, err
		}
	}
	e.db.SetMaxOpenConns(64)
	e.db.SetMaxIdleConns(64)
	e.stops = append(e.stops, func() { _ = e.db.Close() })
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := e.db.PingContext(pctx); err != nil {
		return nil, fmt.Errorf("the database handle: %w", err)
	}
	a, err := app.New(app.Config{DB: e.db, Log: h.cfg.Log, ReadContext: func(ctx context.Context) context.Context { return larder.WithStaleness(ctx, h.cfg.Staleness) }})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	// Each emulated user carries its read-your-writes session in a cookie
	// (without one, a read would wait for every user's writes: the
	// client's own session).
	mux.Handle("/Listing", larder.HTTPSessions(listing(e.db, h.cfg.Staleness)))
	mux.Handle("/", larder.HTTPSessions(a.Handler()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	e.stops = append(e.stops, func() { _ = srv.Close() })
	e.base = "http://" + ln.Addr().String()
	ok = true
	return e, nil
}

// edgeNATS returns the NATS URL the edge's client and cache-node use: the
// hub across the link, or a leaf node at the edge whose link to the hub
// crosses it.
func (h *harness) edgeNATS(ctx context.Context, e *edge) (string, error) {
	if h.cfg.Leaf != nil {
		leafHub, err := e.link.Proxy("nats-leaf", h.cfg.Leaf.HubLeafAddr)
		if err != nil {
			return "", err
		}
		lc := *h.cfg.Leaf
		lc.HubLeafAddr = leafHub
		lc.Dir = filepath.Join(h.dir, "leaf-"+fmt.Sprint(time.Now().UnixNano()))
		leaf, err := StartLeaf(ctx, lc)
		if err != nil {
			return "", err
		}
		e.stops = append(e.stops, func() { _ = leaf.Close() })
		return leaf.URL(), nil
	}
	natsHost, err := hostPort(h.cfg.NATSURL)
	if err != nil {
		return "", err
	}
	w, err := e.link.Proxy("nats", natsHost)
	if err != nil {
		return "", err
	}
	return "nats://" + w, nil
}

// startNode runs the edge's cache-node (memory store) on natsURL.
func (h *harness) startNode(e *edge, natsURL string) (string, error) {
	o := daemon.Options{Listen: "127.0.0.1:0", NATS: natsURL, Store: "memory", Memory: 256 << 20, TLS: h.serverTLS}
	seed := h.cfg.NATSNodeSeed
	if h.cfg.Leaf != nil {
		seed = h.cfg.Leaf.NodeSeed
	}
	if seed != "" {
		opt, err := nats.NkeyOptionFromSeed(seed)
		if err != nil {
			return "", err
		}
		o.NATSOptions = []nats.Option{opt}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, o, h.cfg.Log, ready) }()
	select {
	case addr := <-ready:
		e.stops = append(e.stops, func() { cancel(); <-done })
		return addr, nil
	case err := <-done:
		cancel()
		if err == nil {
			err = errors.New("stopped")
		}
		return "", err
	case <-time.After(60 * time.Second):
		cancel()
		return "", errors.New("not ready in 60 s")
	}
}

// newUsers returns the users of a mix.
func (h *harness) newUsers(m string) (func(vu int) user, error) {
	switch m {
	case MixBrowsing, MixBidding:
		t, err := mix.Load(m)
		if err != nil {
			return nil, err
		}
		return func(vu int) user { return newRUBiSUser(t, h.cfg.Size, vu, time.Now().UnixNano()+int64(vu)) }, nil
	case MixListing:
		return func(vu int) user {
			return &listingUser{r: newRand(time.Now().UnixNano() + int64(vu)), size: h.cfg.Size}
		}, nil
	}
	return nil, fmt.Errorf("unknown mix %q", m)
}

// runMix warms the edge up on a mix, then measures it.
func (h *harness) runMix(ctx context.Context, e *edge, s Setting, mode, m string) (Run, error) {
	users, err := h.newUsers(m)
	if err != nil {
		return Run{}, err
	}
	measure := func(d time.Duration) Stats {
		if m != MixListing {
			return drive(ctx, e.base, h.cfg.VUs, d, users)
		}
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); bidder(bctx, e.base, h.cfg.Size, h.cfg.BidEvery, time.Now().UnixNano()) }()
		st := drive(ctx, e.base, h.cfg.VUs, d, users)
		cancel()
		<-done
		return st
	}
	if h.cfg.Warmup > 0 {
		measure(h.cfg.Warmup)
	}
	b0 := e.link.Bytes()
	reads0 := h.reads(e)
	var o0 larder.OriginStats
	if e.dsn != "" {
		o0, _ = larder.DriverOriginStats(e.dsn)
	}
	st := measure(h.cfg.Duration)
	r := Run{Setting: s.Name, Mode: mode, Mix: m, VUs: h.cfg.VUs, Stats: st, WAN: map[string][2]int64{}}
	for name, b := range e.link.Bytes() {
		d := [2]int64{b[0] - b0[name][0], b[1] - b0[name][1]}
		r.WAN[name] = d
		r.WANBytes += d[0] + d[1]
	}
	if reads1 := h.reads(e); reads1 != nil {
		r.Reads = map[string]int64{}
		for k, v := range reads1 {
			r.Reads[k] = v - reads0[k]
		}
	}
	if e.dsn != "" {
		o1, _ := larder.DriverOriginStats(e.dsn)
		o := larder.OriginStats{Statements: o1.Statements - o0.Statements, BytesReceived: o1.BytesReceived - o0.BytesReceived,
			BytesRaw: o1.BytesRaw - o0.BytesRaw, Refetches: o1.Refetches - o0.Refetches, Fallbacks: o1.Fallbacks - o0.Fallbacks, Store: o1.Store}
		r.Origin = &o
	}
	return r, nil
}

// reads returns the client's reads by source (nil for direct).
func (h *harness) reads(e *edge) map[string]int64 {
	if e.dsn == "" {
		return nil
	}
	st, ok := larder.DriverStats(e.dsn)
	if !ok {
		return nil
	}
	return map[string]int64{"l1": st.L1Hits.Load(), "node": st.NodeHits.Load(), "database": st.Misses.Load(),
		"fresh-snapshots": st.NowSnapshots.Load(), "tx-fallbacks": st.Fallbacks.Load(), "node-lookups": st.NodeLookups.Load(), "uncacheable": st.Uncacheable.Load(),
		"miss-compulsory": st.NodeMisses[store.MissCompulsory].Load(), "miss-staleness": st.NodeMisses[store.MissStaleness].Load(),
		"miss-capacity": st.NodeMisses[store.MissCapacity].Load(), "miss-consistency": st.NodeMisses[store.MissConsistency].Load(),
		"node-errors": st.NodeErrors.Load(), "node-timeouts": st.NodeTimeouts.Load(), "node-bypassed": st.NodeBypassed.Load()}
}

// modeLabel is a mode's description for reports.
func modeLabel(m string) string {
	switch m {
	case ModeDirect:
		return "(a) PostgreSQL over the WAN"
	case ModeOriginRows:
		return "(b) Larder + origin, rows verbatim"
	case ModeOriginRecipes:
		return "(c) Larder + origin, recipes"
	}
	return strings.TrimSpace(m)
}
