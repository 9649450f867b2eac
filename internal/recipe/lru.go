package recipe

// lru is the eviction model shared by the origin's Tracker and the edge's
// RowStore: both run this code over the same sequence of (hash, charge)
// observations, so both evict the same rows. It holds hashes and charges
// only; the RowStore keeps the rows beside it, in slices indexed by slot.
//
// Nodes live in one slice linked by int32 slot numbers rather than
// pointers: per row it costs the map entry and a 40-byte node, and the
// garbage collector has no pointers to chase.
//
// Not safe for concurrent use: its owner's mutex guards it.
type lru struct {
	cfg   Config
	index map[RowHash]int32
	nodes []lruNode
	free  []int32 // slots of evicted rows, reused before the slice grows
	head  int32   // most recently used slot, or none
	tail  int32   // least recently used slot, or none
	bytes int64   // sum of charges held
	// onEvict, when set, is called with the slot of each evicted row
	// before the slot can be reused.
	onEvict func(slot int32)
	// evictions counts rows evicted since the model was made.
	evictions uint64
}

const none = int32(-1)

type lruNode struct {
	hash       RowHash
	charge     int64
	prev, next int32 // towards head, towards tail
}

func newLRU(cfg Config) *lru {
	return &lru{cfg: cfg, index: make(map[RowHash]int32), head: none, tail: none}
}

// reset forgets every row, keeping the counters.
func (l *lru) reset(cfg Config) {
	l.cfg = cfg
	l.index = make(map[RowHash]int32)
	l.nodes = nil
	l.free = nil
	l.head, l.tail = none, none
	l.bytes = 0
}

func (l *lru) len() int { return len(l.index) }

// lookup returns the slot holding h.
func (l *lru) lookup(h RowHash) (int32, bool) {
	s, ok := l.index[h]
	return s, ok
}

// observe records that the row h of n bytes was delivered: it becomes the
// most recently used row, inserted if absent, and rows are evicted from
// the tail while the budget is exceeded. The caller has checked
// cfg.storable(n). It returns the row's slot and whether it was present.
func (l *lru) observe(h RowHash, n int) (slot int32, present bool) {
	if s, ok := l.index[h]; ok {
		l.unlink(s)
		l.pushFront(s)
		return s, true
	}
	if k := len(l.free); k > 0 {
		slot = l.free[k-1]
		l.free = l.free[:k-1]
	} else {
		slot = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{})
	}
	c := Charge(n)
	l.nodes[slot] = lruNode{hash: h, charge: c, prev: none, next: none}
	l.index[h] = slot
	l.pushFront(slot)
	l.bytes += c
	// The new row's charge is within MaxBytes and MaxRows >= 1, so the
	// loop stops before it reaches the new row.
	for l.bytes > l.cfg.MaxBytes || len(l.index) > l.cfg.MaxRows {
		l.evict(l.tail)
	}
	return slot, false
}

// remove drops h if held, as an eviction would.
func (l *lru) remove(h RowHash) bool {
	s, ok := l.index[h]
	if ok {
		l.evict(s)
	}
	return ok
}

func (l *lru) evict(s int32) {
	if l.onEvict != nil {
		l.onEvict(s)
	}
	l.unlink(s)
	delete(l.index, l.nodes[s].hash)
	l.bytes -= l.nodes[s].charge
	l.nodes[s] = lruNode{prev: none, next: none}
	l.free = append(l.free, s)
	l.evictions++
}

func (l *lru) unlink(s int32) {
	n := &l.nodes[s]
	if n.prev != none {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next != none {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = none, none
}

func (l *lru) pushFront(s int32) {
	n := &l.nodes[s]
	n.prev = none
	n.next = l.head
	if l.head != none {
		l.nodes[l.head].prev = s
	}
	l.head = s
	if l.tail == none {
		l.tail = s
	}
}

// order returns the held hashes from most to least recently used (tests).
func (l *lru) order() []RowHash {
	var out []RowHash
	for s := l.head; s != none; s = l.nodes[s].next {
		out = append(out, l.nodes[s].hash)
	}
	return out
}
