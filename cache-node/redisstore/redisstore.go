package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// DefaultTTL is how long a version's value lives without being put again.
// Every value needs a TTL: volatile-lru evicts only keys that have one.
const DefaultTTL = 7 * 24 * time.Hour

// Options configure New.
type Options struct {
	// Client is the Redis to use: a *redis.Client (one server, or a
	// Sentinel-managed primary from redis.NewFailoverClient). The caller
	// keeps ownership: Close does not close it. The store needs no CONFIG
	// rights (see "Server settings" in the package documentation for the
	// ACL rules it needs).
	Client redis.UniversalClient
	// Prefix namespaces every key of the store ("larder" by default).
	Prefix string
	// MaxMemory is the byte budget the node was given for the store's
	// data (0: none). The server's maxmemory, the operator's setting,
	// enforces the budget: New reads it, and the budget (Stats.Budget) is
	// maxmemory above the baseline (see "Budget and Stats" in the package
	// documentation); New warns when that differs from MaxMemory by more
	// than an eighth, or when the server has no maxmemory. With
	// ConfigureServer, New sets maxmemory from MaxMemory instead, and the
	// budget is MaxMemory.
	MaxMemory int64
	// ConfigureServer is for a Redis the caller owns (tests): New sets
	// maxmemory to the baseline plus MaxMemory (which must be > 0), with
	// maxmemory-policy volatile-lru, and turns on the keyspace
	// notifications of evicted and expired keys. It needs CONFIG rights;
	// a cache-node leaves it off and its Redis is configured by the
	// operator.
	ConfigureServer bool
	// TTL of the values (DefaultTTL when 0), refreshed when a version is
	// put again.
	TTL time.Duration
	// Log receives New's warnings about the server's settings (see
	// ServerSettings); slog.Default() when nil.
	Log *slog.Logger
}

// ServerSettings are the server's settings the store relies on, as New
// found them, and what they cost (see "Server settings" in the package
// documentation). A setting that would make the store serve stale results
// is not here: New refuses it with an error.
type ServerSettings struct {
	// MaxMemory and Policy are the server's maxmemory (0: none) and
	// maxmemory-policy when New checked them (INFO memory).
	MaxMemory int64
	Policy    string
	// Notifications reports that keyevent notifications reach the store:
	// New let a key of its own expire and saw the notification (or turned
	// them on, with ConfigureServer). Those of evicted keys cannot be seen
	// without CONFIG GET or an eviction: they come from the same setting
	// (notify-keyspace-events "Exe") and are taken to be on alike.
	Notifications bool
	// Configured reports that New set the settings (ConfigureServer).
	Configured bool
	// Warnings describe the settings that cost efficiency, not
	// correctness, each with what to set instead; New logged them.
	Warnings []string
}

// Store is a store.Backend and store.Persistent on Redis.
type Store struct {
	rdb      *redis.Client
	p        string // Prefix + ":"
	ttl      time.Duration
	budget   int64 // 0: unknown or unlimited
	ghosts   int64 // entries of the ring of evicted keys
	baseline int64 // used_memory that is not the store's data, measured by New
	ev       *events
	sc       *scripts
	token    string // random, in the scripts' source and the probe key
	legacy   bool   // store.OrderDependentForTest when made
	server   ServerSettings

	// lost is set when the server answered NOSCRIPT (it restarted): every
	// operation fails with store.ErrLost until EndOpen. gen counts the
	// losses: an operation that started before one is not trusted.
	lost atomic.Bool
	gen  atomic.Uint64
	// recoverMu serializes EndOpen's reload of the scripts.
	recoverMu sync.Mutex

	closeOnce sync.Once
}

var (
	_ store.Backend    = (*Store)(nil)
	_ store.Persistent = (*Store)(nil)
)

// Ghost ring bounds: 4 bytes per remembered key.
const (
	minGhosts = 1 << 10
	maxGhosts = 1 << 16
)

// ghostEntries sizes the ring of evicted keys: 4 bytes for every 64 bytes
// of budget, from 1024 to 65536 keys.
func ghostEntries(budget int64) int64 {
	if budget <= 0 {
		return maxGhosts
	}
	return min(max(budget/64, minGhosts), maxGhosts)
}

// New opens the store on opts.Client: it checks the server's settings
// (configures them with Options.ConfigureServer), loads the scripts and
// subscribes to the eviction notifications.
func New(ctx context.Context, opts Options) (*Store, error) {
	var rdb *redis.Client
	switch c := opts.Client.(type) {
	case *redis.Client:
		rdb = c
	case nil:
		return nil, errors.New("redisstore: Options.Client is nil")
	default:
		return nil, fmt.Errorf("redisstore: a %T is not supported: the store needs one Redis (a *redis.Client); the cache-nodes' DHT does the sharding", c)
	}
	if opts.MaxMemory < 0 || (opts.ConfigureServer && opts.MaxMemory == 0) {
		return nil, fmt.Errorf("redisstore: MaxMemory %d (ConfigureServer %v)", opts.MaxMemory, opts.ConfigureServer)
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "larder"
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("redisstore: TTL %v", ttl)
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Store{rdb: rdb, p: prefix + ":", ttl: ttl, legacy: store.OrderDependentForTest.Load()}
	var token [12]byte
	if _, err := rand.Read(token[:]); err != nil {
		return nil, err
	}
	s.token = hex.EncodeToString(token[:])
	s.sc = newScripts(s.token, s.legacy)

	// Credentials stay out of errors: the address and the user name only.
	if err := rdb.Ping(ctx).Err(); err != nil {
		who := ""
		if u := rdb.Options().Username; u != "" {
			who = " as user " + u
		}
		return nil, fmt.Errorf("redisstore: connect to Redis at %s%s: %w", rdb.Options().Addr, who, err)
	}
	mem, err := s.readSettings(ctx)
	if err != nil {
		return nil, err
	}
	s.server = mem
	if opts.ConfigureServer {
		if err := s.configureNotifications(ctx); err != nil {
			return nil, err
		}
		s.ghosts = ghostEntries(opts.MaxMemory)
	} else {
		if err := checkPolicy(mem.Policy); err != nil {
			return nil, err
		}
		s.ghosts = ghostEntries(mem.MaxMemory)
	}
	if err := s.loadScripts(ctx); err != nil {
		return nil, err
	}
	// Without notifications, the lazy cleanup does their work, later.
	const without = "the entries of evicted and expired values stay until a script meets them, and Stats counts them"
	if s.ev, err = startEvents(ctx, s); errors.Is(err, errNoChannelRights) {
		s.warn(err.Error() + "; without them, " + without)
	} else if err != nil {
		return nil, err
	}
	if s.ev != nil && !opts.ConfigureServer {
		seen, err := s.ev.probe(ctx, s.p+"probe:"+s.token)
		switch {
		case err != nil:
			s.warn(fmt.Sprintf("could not tell whether keyevent notifications arrive (%v); without them, %s", err, without))
		case !seen:
			s.warn("no keyevent notification of an expired key reached the store (notify-keyspace-events lacks E or x): " +
				without + "; set notify-keyspace-events Exe")
		}
		s.server.Notifications = seen
	}
	if err := s.warm(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.measureBaseline(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if opts.ConfigureServer {
		s.budget = opts.MaxMemory
		maxmemory := s.baseline + opts.MaxMemory - evictionMargin(opts.MaxMemory)
		err := rdb.Do(ctx, "CONFIG", "SET",
			"maxmemory", strconv.FormatInt(maxmemory, 10),
			"maxmemory-policy", "volatile-lru").Err()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("redisstore: configure maxmemory: %w", err)
		}
		s.server.MaxMemory, s.server.Policy, s.server.Configured = maxmemory, "volatile-lru", true
	} else if err := s.checkMemory(opts.MaxMemory); err != nil {
		s.Close()
		return nil, err
	}
	for _, w := range s.server.Warnings {
		log.Warn("redisstore: "+w, "addr", rdb.Options().Addr, "prefix", prefix)
	}
	return s, nil
}

// Server returns the server's settings as New found them.
func (s *Store) Server() ServerSettings {
	out := s.server
	out.Warnings = append([]string(nil), s.server.Warnings...)
	return out
}

func (s *Store) warn(w string) { s.server.Warnings = append(s.server.Warnings, w) }

// readSettings reads maxmemory and maxmemory-policy from INFO memory,
// which needs no CONFIG rights.
func (s *Store) readSettings(ctx context.Context) (ServerSettings, error) {
	txt, err := s.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return ServerSettings{}, fmt.Errorf("redisstore: INFO: %w", err)
	}
	fields := infoFields(txt)
	mm, err := strconv.ParseInt(fields["maxmemory"], 10, 64)
	if err != nil || fields["maxmemory_policy"] == "" {
		return ServerSettings{}, errors.New("redisstore: INFO memory has no maxmemory or maxmemory_policy: not a Redis 7")
	}
	return ServerSettings{MaxMemory: mm, Policy: fields["maxmemory_policy"]}, nil
}

// checkPolicy refuses a maxmemory-policy that may evict keys without a TTL
// (the index sets: a version missing from its sets never gets its end and
// is served after its data changed).
func checkPolicy(policy string) error {
	switch policy {
	case "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl", "noeviction":
		return nil
	}
	return fmt.Errorf("redisstore: the server's maxmemory-policy is %s: it may evict the store's index sets, "+
		"and a version missing from its sets is served after its data changed; set maxmemory-policy volatile-lru", policy)
}

// checkMemory sets the budget from the server's maxmemory, and warns of
// settings that cost efficiency: no maxmemory, a policy other than
// volatile-lru, a budget far from the node's (want).
func (s *Store) checkMemory(want int64) error {
	mm := s.server.MaxMemory
	if mm == 0 {
		w := "the server has no maxmemory: Redis never evicts, and the store grows until its values expire (TTL " + s.ttl.String() + ")"
		if want > 0 {
			w += fmt.Sprintf(", whatever its budget of %d bytes", want)
		}
		s.warn(w + fmt.Sprintf("; set maxmemory to the budget plus %d bytes the server uses besides the store's data", s.baseline))
		return nil
	}
	if mm <= s.baseline {
		return fmt.Errorf("redisstore: the server's maxmemory %d leaves no room for the store's data: the server uses %d bytes besides it; "+
			"set maxmemory to the budget plus that", mm, s.baseline)
	}
	s.budget = mm - s.baseline
	s.budget += evictionMargin(s.budget)
	if want > 0 && (s.budget < want-want/8 || s.budget > want+want/8) {
		s.warn(fmt.Sprintf("the server's maxmemory %d leaves the store %d bytes, not its budget of %d: the server's setting applies; "+
			"set maxmemory to about %d", mm, s.budget, want, s.baseline+want))
	}
	switch p := s.server.Policy; p {
	case "volatile-lru":
	case "noeviction":
		s.warn("maxmemory-policy noeviction: once maxmemory is reached every put fails until values expire; set maxmemory-policy volatile-lru")
	default:
		s.warn("maxmemory-policy " + p + " evicts values only, as the store needs, but not the least recently used first; set maxmemory-policy volatile-lru")
	}
	return nil
}

// configureNotifications turns on the keyevent notifications of evicted
// and expired keys (ConfigureServer).
func (s *Store) configureNotifications(ctx context.Context) error {
	cur, err := configGet(ctx, s.rdb, "notify-keyspace-events")
	if err != nil {
		return err
	}
	if notify := withEvictionEvents(cur); notify != cur {
		if err := s.rdb.ConfigSet(ctx, "notify-keyspace-events", notify).Err(); err != nil {
			return fmt.Errorf("redisstore: turn on eviction notifications: %w", err)
		}
	}
	evicted, expired := eventsOn(withEvictionEvents(cur))
	s.server.Notifications = evicted && expired
	return nil
}

// loadScripts loads the store's scripts and sets up the ring of evicted
// keys.
func (s *Store) loadScripts(ctx context.Context) error {
	if err := warmScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("redisstore: load scripts: %w", err)
	}
	for _, sc := range append([]*redis.Script{initGhostsScript}, s.sc.all...) {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("redisstore: load scripts: %w", err)
		}
	}
	if err := initGhostsScript.EvalSha(ctx, s.rdb, []string{s.p + "g", s.p + "gi"}, s.ghosts*4).Err(); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// errLost is what every operation returns while the store is lost.
var errLost = fmt.Errorf("redisstore: %w", store.ErrLost)

// run runs one of the store's scripts. It never loads a script: a NOSCRIPT
// answer means the server lost them (a restart, a failover), so the store
// is lost until EndOpen. An answer to an operation that began before a
// loss is not trusted either (it may come from the new server). The
// legacy store does what go-redis does: it loads the script and retries.
func (s *Store) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.legacy {
		return sc.Run(ctx, s.rdb, keys, args...)
	}
	gen := s.gen.Load()
	if s.lost.Load() {
		return lostCmd(ctx)
	}
	cmd := sc.EvalSha(ctx, s.rdb, keys, args...)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		s.markLost()
		return lostCmd(ctx)
	}
	if s.gen.Load() != gen || s.lost.Load() {
		return lostCmd(ctx)
	}
	return cmd
}

func lostCmd(ctx context.Context) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(errLost)
	return cmd
}

func (s *Store) markLost() {
	if s.lost.CompareAndSwap(false, true) {
		s.gen.Add(1)
	}
}

// warm runs every command the store sends once (see warmSrc), and Stats
// (which waits for the notification subscriber) once.
func (s *Store) warm(ctx context.Context) error {
	scratch := []string{s.p + "warm:h", s.p + "warm:s", s.p + "warm:v"}
	if err := warmScript.EvalSha(ctx, s.rdb, scratch).Err(); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	if err := s.rdb.Get(ctx, scratch[2]).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redisstore: %w", err)
	}
	_, err := s.Stats(ctx)
	return err
}

// evictionMargin is how far under the budget maxmemory is set: Redis
// evicts before a command runs, and what the command then allocates (the
// reply INFO builds while it reads used_memory) is above that.
func evictionMargin(budget int64) int64 { return min(4<<10, budget/8) }

// measureBaseline sets the baseline, the server's memory that is not this
// store's data: used_memory now (start-up, connections, scripts, the
// ghost ring, whatever else the server holds) minus the size of the
// versions the store already holds (a restart on a warm Redis), as the
// scripts count it with store.Version.Size.
func (s *Store) measureBaseline(ctx context.Context) error {
	info, err := s.info(ctx, "memory", "stats") // as Stats reads it
	if err != nil {
		return err
	}
	held, err := s.rdb.HGet(ctx, s.p+"n", "bytes").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redisstore: %w", err)
	}
	s.baseline = max(info["used_memory"]-max(held, 0), info["used_memory_startup"])
	return nil
}

func configGet(ctx context.Context, rdb *redis.Client, name string) (string, error) {
	m, err := rdb.ConfigGet(ctx, name).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: CONFIG GET %s: %w", name, err)
	}
	return m[name], nil
}

// eventsOn reads notify-keyspace-events: does the server publish keyevent
// notifications of evicted and of expired keys?
func eventsOn(flags string) (evicted, expired bool) {
	if !strings.ContainsRune(flags, 'E') {
		return false, false
	}
	all := strings.ContainsRune(flags, 'A')
	return all || strings.ContainsRune(flags, 'e'), all || strings.ContainsRune(flags, 'x')
}

// withEvictionEvents adds keyevent notifications of evicted and expired
// keys to the server's flags.
func withEvictionEvents(flags string) string {
	all := strings.ContainsRune(flags, 'A') // A includes e and x, not E
	for _, f := range []struct {
		flag rune
		inA  bool
	}{{'E', false}, {'e', true}, {'x', true}} {
		if !strings.ContainsRune(flags, f.flag) && !(f.inA && all) {
			flags += string(f.flag)
		}
	}
	return flags
}

// Key names.
func (s *Store) tagSet(tag string) string     { return s.p + "t:" + tag }
func (s *Store) tableSet(table string) string { return s.p + "T:" + table }
func (s *Store) wmKey() string                { return s.p + "wm" }

// Lookup implements store.Backend.
func (s *Store) Lookup(ctx context.Context, key []byte, tmin, tmax, watermark uint64) (store.Result, error) {
	wm1 := uint64(store.Open)
	if watermark != store.Open {
		wm1 = watermark + 1
	}
	res, err := s.run(ctx, s.sc.lookup, nil, s.p, key, u64(tmin), u64(tmax), u64(wm1)).Slice()
	if err != nil {
		return store.Result{}, fmt.Errorf("redisstore: lookup: %w", err)
	}
	class, ok := res[0].(int64)
	if !ok {
		return store.Result{}, fmt.Errorf("redisstore: lookup: unexpected reply %v", res)
	}
	if class != 0 {
		return store.Result{Miss: store.MissClass(class)}, nil
	}
	if len(res) != 5 {
		return store.Result{}, fmt.Errorf("redisstore: lookup: a hit of %d fields", len(res))
	}
	var f [3]uint64
	for i := range f {
		str, _ := res[1+i].(string)
		if f[i], err = parseU64(str); err != nil {
			return store.Result{}, err
		}
	}
	val, _ := res[4].(string)
	hi, open := servedHi(f[1], watermark, s.legacy)
	return store.Result{Miss: store.Hit, Lo: f[0], Hi: hi, Open: open, Snapshot: f[2], Value: []byte(val)}, nil
}

// servedHi is the Hi a lookup reports: no version, open or closed, is
// served beyond the watermark. legacy serves a closed Hi as it is.
func servedHi(hi, watermark uint64, legacy bool) (uint64, bool) {
	open := hi == store.Open
	if legacy && !open {
		return hi, false
	}
	if watermark != store.Open && watermark+1 < hi {
		hi = watermark + 1
	}
	return hi, open
}

// Put implements store.Backend. A Redis out of memory (its maxmemory
// reached by what cannot be evicted) refuses it with an error.
func (s *Store) Put(ctx context.Context, key []byte, v *store.Version) error {
	if s.budget > 0 && v.Size(len(key)) > s.budget {
		return store.ErrTooLarge
	}
	entry, err := encodeEntry(v, len(key))
	if err != nil {
		return err
	}
	value := v.Value
	if value == nil {
		value = []byte{}
	}
	err = s.run(ctx, s.sc.put, nil, s.p, key, u64(v.Snapshot), entry, value, s.ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("redisstore: put: %w", err)
	}
	return nil
}

// Confirm implements store.Backend.
func (s *Store) Confirm(ctx context.Context, key []byte, snapshot, lo, hi uint64) error {
	if err := s.run(ctx, s.sc.confirm, nil, s.p, key, u64(snapshot), u64(lo), u64(hi)).Err(); err != nil {
		return fmt.Errorf("redisstore: confirm: %w", err)
	}
	return nil
}

// Invalidate implements store.Backend: it reads only the index sets of the
// changed tags (and of the flushed tables), in one script.
func (s *Store) Invalidate(ctx context.Context, lsn uint64, changes []invalidation.Change) error {
	if len(changes) == 0 {
		return nil
	}
	keys := make([]string, len(changes))
	args := make([]any, 0, 2+4*len(changes))
	args = append(args, s.p, u64(lsn))
	for i := range changes {
		c := &changes[i]
		if c.Flush {
			keys[i] = s.tableSet(c.Tag)
		} else {
			keys[i] = s.tagSet(c.Tag)
		}
		args = changeArgs(args, c)
	}
	if err := s.run(ctx, s.sc.invalidate, keys, args...).Err(); err != nil {
		return fmt.Errorf("redisstore: invalidate at %d: %w", lsn, err)
	}
	return nil
}

// EndOpen implements store.Backend. On a lost store (store.ErrLost) it
// loads the scripts again, ends every version at min(hi, the watermark the
// server kept + 1) (0 when it kept none) and makes the store usable again.
func (s *Store) EndOpen(ctx context.Context, hi uint64) error {
	if s.legacy || !s.lost.Load() {
		if err := s.run(ctx, s.sc.endOpen, nil, s.p, u64(hi)).Err(); err != nil {
			return fmt.Errorf("redisstore: end open versions: %w", err)
		}
		return nil
	}
	s.recoverMu.Lock()
	defer s.recoverMu.Unlock()
	if !s.lost.Load() {
		return s.EndOpen(ctx, hi)
	}
	// A server that restarted came back with its configuration file's
	// settings.
	mem, err := s.readSettings(ctx)
	if err != nil {
		return err
	}
	if err := checkPolicy(mem.Policy); err != nil {
		return err
	}
	if err := s.loadScripts(ctx); err != nil {
		return err
	}
	wm, saved, err := s.SavedWatermark(ctx)
	if err != nil {
		return err
	}
	if !saved {
		hi = 0
	} else if wm+1 < hi {
		hi = wm + 1
	}
	err = s.sc.endOpen.EvalSha(ctx, s.rdb, nil, s.p, u64(hi)).Err()
	if err != nil {
		return fmt.Errorf("redisstore: end versions after a restart of the server: %w", err)
	}
	s.lost.Store(false)
	return nil
}

// Settle implements store.Backend. It also saves the watermark, in the
// same script (see store.Persistent).
func (s *Store) Settle(ctx context.Context, watermark uint64) error {
	wm1 := uint64(store.Open)
	if watermark != store.Open {
		wm1 = watermark + 1
	}
	if err := s.run(ctx, s.sc.settle, nil, s.p, u64(wm1), strconv.FormatUint(watermark, 10)).Err(); err != nil {
		return fmt.Errorf("redisstore: settle: %w", err)
	}
	return nil
}

// OpenGroups implements store.GroupLister: the tags and tables whose index
// sets exist (an index set holds unsettled versions only; a dangling
// member only makes a group followed for nothing).
func (s *Store) OpenGroups(ctx context.Context) ([]string, error) {
	var out []string
	for _, kind := range []struct{ pattern, prefix, name string }{
		{s.tagSet("*"), s.tagSet(""), ""}, {s.tableSet("*"), s.tableSet(""), "table:"},
	} {
		iter := s.rdb.Scan(ctx, 0, kind.pattern, 1000).Iterator()
		for iter.Next(ctx) {
			out = append(out, kind.name+strings.TrimPrefix(iter.Val(), kind.prefix))
		}
		if err := iter.Err(); err != nil {
			return nil, fmt.Errorf("redisstore: list groups: %w", err)
		}
	}
	return out, nil
}

// Holds implements store.Backend. It drops the dangling members it meets.
func (s *Store) Holds(ctx context.Context, names []string) ([]bool, error) {
	if len(names) == 0 {
		return nil, nil
	}
	keys := make([]string, len(names))
	for i, n := range names {
		if t, ok := strings.CutPrefix(n, "table:"); ok && t != "" {
			keys[i] = s.tableSet(t)
		} else {
			keys[i] = s.tagSet(n)
		}
	}
	res, err := s.run(ctx, s.sc.holds, keys, s.p).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstore: holds: %w", err)
	}
	out := make([]bool, len(names))
	for i := range out {
		out[i] = i < len(res) && res[i] == 1
	}
	return out, nil
}

// Stats implements store.Backend. Keys and Versions are the store's own
// counts; Bytes is the server's used_memory above the baseline New
// measured; Budget is the budget New set (the server's maxmemory above
// the baseline, or MaxMemory with ConfigureServer: see the package
// documentation); Evictions is the server's evicted_keys. Stats first
// waits until every eviction notification sent before it is applied.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	if s.ev != nil {
		if err := s.ev.sync(ctx); err != nil {
			return store.Stats{}, err
		}
	}
	pipe := s.rdb.Pipeline()
	counts := pipe.HMGet(ctx, s.p+"n", "keys", "versions")
	info := pipe.Info(ctx, "memory", "stats")
	if _, err := pipe.Exec(ctx); err != nil {
		return store.Stats{}, fmt.Errorf("redisstore: stats: %w", err)
	}
	st := store.Stats{Budget: s.budget}
	for i, v := range counts.Val() {
		n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		if i == 0 {
			st.Keys = n
		} else {
			st.Versions = n
		}
	}
	m := parseInfo(info.Val())
	st.Bytes = max(m["used_memory"]-s.baseline, 0)
	st.Evictions = m["evicted_keys"]
	return st, nil
}

// Close implements store.Backend: it stops the notification subscriber.
// The client stays open.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.ev != nil {
			s.ev.close()
		}
	})
	return nil
}

// SaveWatermark implements store.Persistent. The key has no TTL.
func (s *Store) SaveWatermark(ctx context.Context, wm uint64) error {
	if err := s.run(ctx, s.sc.saveWatermark, nil, s.p, strconv.FormatUint(wm, 10)).Err(); err != nil {
		return fmt.Errorf("redisstore: save watermark: %w", err)
	}
	return nil
}

// SavedWatermark implements store.Persistent. It works on a lost store:
// it is what the node ends versions at after a restart of the server.
func (s *Store) SavedWatermark(ctx context.Context) (uint64, bool, error) {
	v, err := s.rdb.Get(ctx, s.wmKey()).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("redisstore: saved watermark: %w", err)
	}
	wm, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("redisstore: saved watermark %q: %w", v, err)
	}
	return wm, true, nil
}

func (s *Store) info(ctx context.Context, sections ...string) (map[string]int64, error) {
	txt, err := s.rdb.Info(ctx, sections...).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstore: INFO: %w", err)
	}
	return parseInfo(txt), nil
}

// parseInfo reads the integer fields of an INFO reply.
func parseInfo(txt string) map[string]int64 {
	m := map[string]int64{}
	for k, v := range infoFields(txt) {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}

// infoFields reads the fields of an INFO reply.
func infoFields(txt string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(txt, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}
