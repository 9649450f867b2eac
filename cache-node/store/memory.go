package store

import (
	"context"
	"sync"

	"github.com/larderdb/larder/internal/invalidation"
)

// Memory is the in-process backend (the embedded default): a hard byte
// budget with LRU eviction of versions.
//
// It may hold millions of versions, each of which every garbage
// collection marks: its bookkeeping is therefore intrusive (the LRU list,
// a key's versions and the tag and table indexes are links inside the
// versions and their dependencies, not list elements, slices and sets of
// their own), so that a version is a handful of heap objects: itself
// (with its dependency, when it has only one), its value, its key and its
// tags' names (BenchmarkMemoryOverhead, objects/version).
type Memory struct {
	mu        sync.Mutex
	budget    int64
	used      int64
	evictions int64
	keys      map[string]*memVersion // each key's newest version; older ones follow older
	lruHead   *memVersion            // most recently used
	lruTail   *memVersion            // least recently used, evicted first
	// index holds the unsettled versions' dependencies by tag (byTag) and
	// by table (byTable): the first of a list linked through memDep.link.
	index     [2]map[string]*memDep
	closed    map[*memVersion]struct{} // unsettled closed versions, for Settle
	legacy    bool                     // OrderDependentForTest when made
	nversions int64
	ghosts    ghostSet
	onRelease func(names []string)
}

// The two indexes of Memory.index.
const (
	byTag = iota
	byTable
)

type memVersion struct {
	Version        // Deps unused: see deps
	key     string // the key's map entry's own string
	deps    []memDep
	older   *memVersion // the key's next version by Snapshot, newest first
	// prev and next link the LRU list, newer towards lruHead.
	prev, next *memVersion
	size       int64
	indexed    bool // unsettled: its deps are in the tag and table indexes
	// one holds deps when there is one (the common case): no heap object
	// of their own.
	one [1]memDep
}

// memDep is one dependency of a version, linked into the index of its tag
// and of its table while the version is unsettled.
type memDep struct {
	Dep
	v    *memVersion
	link [2]struct{ prev, next *memDep } // by byTag and byTable
}

// name is the dependency's name in index i.
func (d *memDep) name(i int) string {
	if i == byTag {
		return d.Tag
	}
	return d.Table
}

// NewMemory returns a memory backend holding at most budget bytes.
// onRelease, if not nil, is called (outside the backend's lock) with the
// tags and "table:"-prefixed tables no unsettled version depends on any
// more.
func NewMemory(budget int64, onRelease func(names []string)) *Memory {
	return &Memory{
		budget:    budget,
		keys:      map[string]*memVersion{},
		index:     [2]map[string]*memDep{{}, {}},
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
	head := m.keys[string(key)]
	if head == nil {
		if m.ghosts.has(string(key)) {
			return Result{Miss: MissCapacity}, nil
		}
		return Result{Miss: MissCompulsory}, nil
	}
	miss := MissCompulsory
	for v := head; v != nil; v = v.older {
		if v.Pending {
			continue
		}
		hi, open := servedHi(v.Hi, watermark, m.legacy)
		if v.Lo <= tmax && hi > tmin && v.Lo < hi {
			m.touch(v)
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
	mv.Version.Deps = nil
	if len(v.Deps) == 1 {
		mv.deps = mv.one[:]
	} else {
		mv.deps = make([]memDep, len(v.Deps))
	}
	for i, d := range v.Deps {
		mv.deps[i] = memDep{Dep: d, v: mv}
	}
	mv.Value = append([]byte(nil), v.Value...)
	mv.size = v.Size(len(key))
	if mv.size > m.budget {
		return ErrTooLarge
	}
	var released []string
	m.mu.Lock()
	head := m.keys[string(key)]
	for have := head; have != nil; have = have.older {
		if have.Snapshot == v.Snapshot {
			m.mu.Unlock()
			return nil
		}
	}
	if head == nil {
		mv.key = string(key)
		m.ghosts.remove(mv.key)
	} else {
		mv.key = head.key
	}
	// Into the key's versions, newest first.
	if head == nil || head.Snapshot < v.Snapshot {
		mv.older = head
		m.keys[mv.key] = mv
	} else {
		p := head
		for p.older != nil && p.older.Snapshot > v.Snapshot {
			p = p.older
		}
		mv.older, p.older = p.older, mv
	}
	m.pushFront(mv)
	m.used += mv.size
	m.nversions++
	m.indexVersion(mv)
	for m.used > m.budget {
		released = m.remove(m.lruTail, released)
		m.evictions++
	}
	m.mu.Unlock()
	m.release(released)
	return nil
}

// Confirm implements Backend.
func (m *Memory) Confirm(_ context.Context, key []byte, snapshot, lo, hi uint64) error {
	m.mu.Lock()
	for v := m.keys[string(key)]; v != nil; v = v.older {
		if v.Snapshot == snapshot {
			v.Lo, v.Pending = lo, false
			m.end(v, hi)
			break
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
			for d := m.index[byTable][c.Tag]; d != nil; d = d.link[byTable].next {
				if v := d.v; v.Snapshot < lsn && (!m.legacy || v.Hi == Open) {
					hit = append(hit, v)
				}
			}
			continue
		}
		for d := m.index[byTag][c.Tag]; d != nil; d = d.link[byTag].next {
			v := d.v
			if v.Snapshot >= lsn || (m.legacy && v.Hi != Open) {
				continue
			}
			if c.Hits(d.Reads, d.AllColumns) && !m.absorb(v, c) {
				hit = append(hit, v)
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
	for _, head := range m.keys {
		for v := head; v != nil; v = v.older {
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
			out[i] = m.index[byTable][t] != nil
		} else {
			out[i] = m.index[byTag][n] != nil
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

// indexVersion puts an unsettled version's dependencies into the indexes.
func (m *Memory) indexVersion(v *memVersion) {
	v.indexed = true
	if v.Hi != Open {
		m.closed[v] = struct{}{}
	}
	for i := range v.deps {
		for idx := range m.index {
			m.link(idx, &v.deps[i])
		}
	}
}

// unindex takes a version's dependencies out of the indexes (it is
// settled, or gone), adding to released the names no version depends on
// any more.
func (m *Memory) unindex(v *memVersion, released []string) []string {
	v.indexed = false
	delete(m.closed, v)
	for i := range v.deps {
		d := &v.deps[i]
		if m.unlink(byTag, d) {
			released = append(released, d.Tag)
		}
		if m.unlink(byTable, d) {
			released = append(released, TableName(d.Table))
		}
	}
	return released
}

// link puts d first in its list of index idx.
func (m *Memory) link(idx int, d *memDep) {
	name := d.name(idx)
	first := m.index[idx][name]
	d.link[idx].prev, d.link[idx].next = nil, first
	if first != nil {
		first.link[idx].prev = d
	}
	m.index[idx][name] = d
}

// unlink takes d out of its list of index idx and reports whether the
// list became empty.
func (m *Memory) unlink(idx int, d *memDep) bool {
	l := &d.link[idx]
	if l.next != nil {
		l.next.link[idx].prev = l.prev
	}
	empty := false
	if l.prev != nil {
		l.prev.link[idx].next = l.next
	} else if l.next != nil {
		m.index[idx][d.name(idx)] = l.next
	} else {
		delete(m.index[idx], d.name(idx))
		empty = true
	}
	l.prev, l.next = nil, nil
	return empty
}

// remove drops a version (eviction).
func (m *Memory) remove(v *memVersion, released []string) []string {
	if v.indexed {
		released = m.unindex(v, released)
	}
	m.unlinkLRU(v)
	m.used -= v.size
	m.nversions--
	if head := m.keys[v.key]; head == v {
		if v.older != nil {
			m.keys[v.key] = v.older
		} else {
			delete(m.keys, v.key)
			m.ghosts.add(v.key)
		}
	} else {
		for p := head; p != nil; p = p.older {
			if p.older == v {
				p.older = v.older
				break
			}
		}
	}
	v.older = nil
	return released
}

// pushFront makes v the most recently used version.
func (m *Memory) pushFront(v *memVersion) {
	v.prev, v.next = nil, m.lruHead
	if m.lruHead != nil {
		m.lruHead.prev = v
	} else {
		m.lruTail = v
	}
	m.lruHead = v
}

// unlinkLRU takes v out of the LRU list.
func (m *Memory) unlinkLRU(v *memVersion) {
	if v.prev != nil {
		v.prev.next = v.next
	} else {
		m.lruHead = v.next
	}
	if v.next != nil {
		v.next.prev = v.prev
	} else {
		m.lruTail = v.prev
	}
	v.prev, v.next = nil, nil
}

// touch makes a served version the most recently used.
func (m *Memory) touch(v *memVersion) {
	if m.lruHead != v {
		m.unlinkLRU(v)
		m.pushFront(v)
	}
}

func (m *Memory) release(names []string) {
	if len(names) > 0 && m.onRelease != nil {
		m.onRelease(names)
	}
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
