package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
	// keeps ownership: Close does not close it.
	Client redis.UniversalClient
	// Prefix namespaces every key of the store ("larder" by default).
	Prefix string
	// MaxMemory, when > 0, is the byte budget: New sets the server's
	// maxmemory to the baseline (the memory that is not the store's data,
	// see Stats) plus MaxMemory, with maxmemory-policy volatile-lru, and
	// turns on the keyspace notifications of evicted and expired keys. 0
	// leaves the server's configuration alone.
	MaxMemory int64
	// TTL of the values (DefaultTTL when 0), refreshed when a version is
	// put again.
	TTL time.Duration
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
	legacy   bool // store.OrderDependentForTest when made

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

// New opens the store on opts.Client: it configures the server when asked
// to (see Options.MaxMemory), loads the scripts and, when the server sends
// eviction notifications, subscribes to them.
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
	if opts.MaxMemory < 0 {
		return nil, fmt.Errorf("redisstore: MaxMemory %d", opts.MaxMemory)
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
	s := &Store{rdb: rdb, p: prefix + ":", ttl: ttl, legacy: store.OrderDependentForTest.Load()}
	var token [12]byte
	if _, err := rand.Read(token[:]); err != nil {
		return nil, err
	}
	s.sc = newScripts(hex.EncodeToString(token[:]), s.legacy)

	var notify string
	if opts.MaxMemory > 0 {
		cur, err := configGet(ctx, rdb, "notify-keyspace-events")
		if err != nil {
			return nil, err
		}
		if notify = withEvictionEvents(cur); notify != cur {
			if err := rdb.ConfigSet(ctx, "notify-keyspace-events", notify).Err(); err != nil {
				return nil, fmt.Errorf("redisstore: turn on eviction notifications: %w", err)
			}
		}
	} else {
		// A server whose CONFIG is renamed or denied still works, without
		// notifications.
		notify, _ = configGet(ctx, rdb, "notify-keyspace-events")
	}
	s.ghosts = ghostEntries(opts.MaxMemory)
	if err := s.loadScripts(ctx); err != nil {
		return nil, err
	}
	if evicted, expired := eventsOn(notify); evicted || expired {
		var err error
		if s.ev, err = startEvents(ctx, s, evicted, expired); err != nil {
			return nil, err
		}
	}
	if err := s.warm(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.measureBaseline(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if opts.MaxMemory > 0 {
		s.budget = opts.MaxMemory
		err := rdb.Do(ctx, "CONFIG", "SET",
			"maxmemory", strconv.FormatInt(s.baseline+opts.MaxMemory-evictionMargin(opts.MaxMemory), 10),
			"maxmemory-policy", "volatile-lru").Err()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("redisstore: configure maxmemory: %w", err)
		}
	} else if m, err := configGet(ctx, rdb, "maxmemory"); err == nil {
		if n, _ := strconv.ParseInt(m, 10, 64); n > s.baseline {
			s.budget = n - s.baseline
		}
	}
	return s, nil
}

// loadScripts loads the store's scripts and sets up the ring of evicted
// keys.
func (s *Store) loadScripts(ctx context.Context) error {
	if err := warmScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("redisstore: load scripts: %w", err)
	}
	for _, sc := range s.sc.all {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("redisstore: load scripts: %w", err)
		}
	}
	if err := initGhostsScript.Run(ctx, s.rdb, []string{s.p + "g", s.p + "gi"}, s.ghosts*4).Err(); err != nil {
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
	if err := warmScript.Run(ctx, s.rdb, scratch).Err(); err != nil {
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
// measured; Budget is MaxMemory (or the server's own maxmemory above the
// baseline); Evictions is the server's evicted_keys. With eviction notifications on,
// Stats first waits until every notification sent before it is applied.
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
	for line := range strings.SplitSeq(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}
