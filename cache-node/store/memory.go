package store

import (
	"container/list"
	"context"
	"sort"
	"sync"

	"github.com/larderdb/larder/internal/invalidation"
)

// Memory is the in-process backend (the embedded default): a hard byte
// budget with LRU eviction of versions.
type Memory struct {
	mu        sync.Mutex
	budget    int64
	used      int64
	evictions int64
	keys      map[string]*memEntry
	lru       *list.List                          // of *memVersion, most recently used at the front
	tags      map[string]map[*memVersion]struct{} // unsettled versions by tag
	tables    map[string]map[*memVersion]struct{} // unsettled versions by table
	closed    map[*memVersion]struct{}            // unsettled closed versions, for Settle
	legacy    bool                                // OrderDependentForTest when made
	nversions int64
	ghosts    ghostSet
	onRelease func(names []string)
}

type memEntry struct {
	key      string
	versions []*memVersion // by Snapshot, newest first
}

type memVersion struct {
	Version
	entry   *memEntry
	size    int64
	elem    *list.Element
	indexed bool // unsettled: in the tag and table indexes
}

// NewMemory returns a memory backend holding at most budget bytes.
// onRelease, if not nil, is called (outside the backend's lock) with the
// tags and "table:"-prefixed tables no unsettled version depends on any
// more.
func NewMemory(budget int64, onRelease func(names []string)) *Memory {
	return &Memory{
		budget:    budget,
		keys:      map[string]*memEntry{},
		lru:       list.New(),
		tags:      map[string]map[*memVersion]struct{}{},
		tables:    map[string]map[*memVersion]struct{}{},
		closed:    map[*memVersion]struct{}{},
		legacy:    OrderDependentForTest.Load(),
		ghosts:    newGhostSet(1 << 16),
		onRelease: onRelease,
	}
}

// Lookup implements Backend.
func (m *Memory) Lookup(_ context.Context, key []byte, tmin, tmax, watermark uint64) (Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[string(key)]
	if e == nil {
		if m.ghosts.has(string(key)) {
			return Result{Miss: MissCapacity}, nil
		}
		return Result{Miss: MissCompulsory}, nil
	}
	miss := MissCompulsory
	for _, v := range e.versions {
		if v.Pending {
			continue
		}
		hi, open := servedHi(v.Hi, watermark, m.legacy)
		if v.Lo <= tmax && hi > tmin && v.Lo < hi {
			m.lru.MoveToFront(v.elem)
			return Result{Miss: Hit, Lo: v.Lo, Hi: hi, Open: open, Snapshot: v.Snapshot, Value: v.Value, Absorbed: v.Absorbed}, nil
		}
		miss = classify(miss, v.Lo, hi, tmin, tmax)
	}
	return Result{Miss: miss}, nil
}

// servedHi is the Hi a lookup reports: no version, open or closed, is
// served beyond the watermark (a closed one may still be shortened by a
// message not yet delivered). legacy serves a closed Hi as it is.
func servedHi(hi, watermark uint64, legacy bool) (uint64, bool) {
	open := hi == Open
	if legacy && !open {
		return hi, false
	}
	if watermark != Open && watermark+1 < hi {
		hi = watermark + 1
	}
	return hi, open
}

// classify folds one non-matching version into the miss class: a version
// newer than the range (or not yet servable: newer than the watermark)
// makes it a consistency miss; one that ended before the range, a
// staleness miss.
func classify(miss MissClass, lo, hi, tmin, tmax uint64) MissClass {
	if lo > tmax || lo >= hi {
		return MissConsistency
	}
	if miss == MissConsistency {
		return miss
	}
	return MissStaleness
}

// Put implements Backend.
func (m *Memory) Put(_ context.Context, key []byte, v *Version) error {
	mv := &memVersion{Version: *v}
	mv.Deps = append([]Dep(nil), v.Deps...)
	mv.Value = append([]byte(nil), v.Value...)
	mv.size = v.Size(len(key))
	if mv.size > m.budget {
		return ErrTooLarge
	}
	var released []string
	m.mu.Lock()
	e := m.keys[string(key)]
	if e == nil {
		e = &memEntry{key: string(key)}
		m.keys[e.key] = e
		m.ghosts.remove(e.key)
	}
	for _, have := range e.versions {
		if have.Snapshot == v.Snapshot {
			m.mu.Unlock()
			return nil
		}
	}
	mv.entry = e
	i := sort.Search(len(e.versions), func(i int) bool { return e.versions[i].Snapshot < v.Snapshot })
	e.versions = append(e.versions, nil)
	copy(e.versions[i+1:], e.versions[i:])
	e.versions[i] = mv
	mv.elem = m.lru.PushFront(mv)
	m.used += mv.size
	m.nversions++
	m.index(mv)
	for m.used > m.budget {
		victim := m.lru.Back().Value.(*memVersion)
		released = m.remove(victim, released)
		m.evictions++
	}
	m.mu.Unlock()
	m.release(released)
	return nil
}

// Confirm implements Backend.
func (m *Memory) Confirm(_ context.Context, key []byte, snapshot, lo, hi uint64) error {
	m.mu.Lock()
	if e := m.keys[string(key)]; e != nil {
		for _, v := range e.versions {
			if v.Snapshot == snapshot {
				v.Lo, v.Pending = lo, false
				m.end(v, hi)
				break
			}
		}
	}
	m.mu.Unlock()
	return nil
}

// Invalidate implements Backend. The indexes hold exactly the unsettled
// versions.
func (m *Memory) Invalidate(_ context.Context, lsn uint64, changes []invalidation.Change) error {
	m.mu.Lock()
	var hit []*memVersion
	for i := range changes {
		c := &changes[i]
		if c.Flush {
			for v := range m.tables[c.Tag] {
				if v.Snapshot < lsn && (!m.legacy || v.Hi == Open) {
					hit = append(hit, v)
				}
			}
			continue
		}
		for v := range m.tags[c.Tag] {
			if v.Snapshot >= lsn || (m.legacy && v.Hi != Open) {
				continue
			}
			for _, d := range v.Deps {
				if d.Tag == c.Tag && c.Hits(d.Reads, d.AllColumns) {
					if !m.absorb(v, c) {
						hit = append(hit, v)
					}
					break
				}
			}
		}
	}
	for _, v := range hit {
		m.end(v, lsn)
	}
	m.mu.Unlock()
	return nil
}

// absorb takes change c into an absorbing open version (Version.Absorbs):
// false when it cannot (it names no rows, or too many), and v must end.
func (m *Memory) absorb(v *memVersion, c *invalidation.Change) bool {
	if !v.Absorbs || v.Hi != Open || c.Keys == nil {
		return false
	}
	keys := invalidation.MergeKeys(v.Absorbed, c.Keys)
	if keys == nil {
		return false
	}
	grown := int64(0)
	for _, k := range keys {
		grown += int64(len(k) + 16)
	}
	for _, k := range v.Absorbed {
		grown -= int64(len(k) + 16)
	}
	v.Absorbed = keys
	v.size += grown
	m.used += grown
	return true
}

// EndOpen implements Backend: every version is visited (a gap is rare),
// then every version is settled.
func (m *Memory) EndOpen(_ context.Context, hi uint64) error {
	var released []string
	m.mu.Lock()
	for _, e := range m.keys {
		for _, v := range e.versions {
			if !m.legacy || v.Hi == Open {
				v.Hi = min(v.Hi, hi)
			}
			if v.indexed {
				released = m.unindex(v, released)
			}
		}
	}
	m.mu.Unlock()
	m.release(released)
	return nil
}

// Settle implements Backend: it visits only the unsettled closed versions
// (those that closed since the last Settle, and those closed beyond the
// watermark).
func (m *Memory) Settle(_ context.Context, watermark uint64) error {
	var released []string
	m.mu.Lock()
	for v := range m.closed {
		if watermark == Open || v.Hi <= watermark+1 {
			released = m.unindex(v, released)
		}
	}
	m.mu.Unlock()
	m.release(released)
	return nil
}

// Holds implements Backend.
func (m *Memory) Holds(_ context.Context, names []string) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]bool, len(names))
	for i, n := range names {
		if t, ok := cutTable(n); ok {
			out[i] = len(m.tables[t]) > 0
		} else {
			out[i] = len(m.tags[n]) > 0
		}
	}
	return out, nil
}

// Stats implements Backend.
func (m *Memory) Stats(context.Context) (Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{Keys: int64(len(m.keys)), Versions: m.nversions, Bytes: m.used, Budget: m.budget, Evictions: m.evictions}, nil
}

// Close implements Backend.
func (m *Memory) Close() error { return nil }

// end sets v.Hi = min(v.Hi, hi). A version that closes stays in the
// indexes until it is settled.
func (m *Memory) end(v *memVersion, hi uint64) {
	if hi < v.Hi {
		v.Hi = hi
	}
	if v.Hi != Open && v.indexed {
		m.closed[v] = struct{}{}
	}
}

func (m *Memory) index(v *memVersion) {
	v.indexed = true
	if v.Hi != Open {
		m.closed[v] = struct{}{}
	}
	for _, d := range v.Deps {
		addTo(m.tags, d.Tag, v)
		addTo(m.tables, d.Table, v)
	}
}

func (m *Memory) unindex(v *memVersion, released []string) []string {
	v.indexed = false
	delete(m.closed, v)
	for _, d := range v.Deps {
		if removeFrom(m.tags, d.Tag, v) {
			released = append(released, d.Tag)
		}
		if removeFrom(m.tables, d.Table, v) {
			released = append(released, TableName(d.Table))
		}
	}
	return released
}

// remove drops a version (eviction).
func (m *Memory) remove(v *memVersion, released []string) []string {
	if v.indexed {
		released = m.unindex(v, released)
	}
	m.lru.Remove(v.elem)
	m.used -= v.size
	m.nversions--
	e := v.entry
	for i, x := range e.versions {
		if x == v {
			e.versions = append(e.versions[:i], e.versions[i+1:]...)
			break
		}
	}
	if len(e.versions) == 0 {
		delete(m.keys, e.key)
		m.ghosts.add(e.key)
	}
	return released
}

func (m *Memory) release(names []string) {
	if len(names) > 0 && m.onRelease != nil {
		m.onRelease(names)
	}
}

func addTo(idx map[string]map[*memVersion]struct{}, name string, v *memVersion) {
	set := idx[name]
	if set == nil {
		set = map[*memVersion]struct{}{}
		idx[name] = set
	}
	set[v] = struct{}{}
}

// removeFrom reports whether the set became empty.
func removeFrom(idx map[string]map[*memVersion]struct{}, name string, v *memVersion) bool {
	set := idx[name]
	if set == nil {
		return false
	}
	delete(set, v)
	if len(set) == 0 {
		delete(idx, name)
		return true
	}
	return false
}

// TableName is how Holds and release callbacks name a table.
func TableName(table string) string { return "table:" + table }

func cutTable(name string) (string, bool) {
	if len(name) > 6 && name[:6] == "table:" {
		return name[6:], true
	}
	return "", false
}

// ghostSet remembers the last n evicted keys, to tell capacity misses from
// compulsory ones.
type ghostSet struct {
	set  map[string]struct{}
	ring []string
	next int
}

func newGhostSet(n int) ghostSet {
	return ghostSet{set: map[string]struct{}{}, ring: make([]string, n)}
}

func (g *ghostSet) add(k string) {
	if old := g.ring[g.next]; old != "" {
		delete(g.set, old)
	}
	g.ring[g.next] = k
	g.set[k] = struct{}{}
	g.next = (g.next + 1) % len(g.ring)
}

func (g *ghostSet) has(k string) bool { _, ok := g.set[k]; return ok }

func (g *ghostSet) remove(k string) { delete(g.set, k) }
