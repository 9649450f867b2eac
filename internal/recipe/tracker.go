package recipe

import (
	"encoding/binary"
	"sync"
)

// Tracker is the origin's model of one edge's RowStore: the hashes of the
// rows it believes the edge holds, never the rows. It runs the store's
// eviction (the shared lru) over the same deliveries in the same order,
// so under the same Config it evicts what the edge evicts. Where the two
// disagree anyway (a lost delivery, an edge restarted without a reset,
// deliveries applied out of order) the edge finds a reference it cannot
// resolve and refetches: a disagreement costs bytes, never correctness.
//
// Memory is bounded by Config.MaxRows (about 80 bytes per row).
//
// A Tracker is safe for concurrent use; recipes are modelled in the order
// their AppendRecipe calls take its lock.
type Tracker struct {
	mu    sync.Mutex   // guards model and stats
	model *lru         // what the edge holds, as far as the origin knows
	stats TrackerStats // counters since NewTracker
}

// TrackerStats are a Tracker's counters since it was made (a Reset does
// not clear them), and what it models now.
type TrackerStats struct {
	Recipes        uint64 // recipes encoded
	RowsVerbatim   uint64 // rows sent as bytes
	RowsReferenced uint64 // rows sent as references
	BytesResult    uint64 // header and row bytes of the results encoded
	BytesSent      uint64 // bytes of the recipes encoded
	// BytesSaved sums, over the rows sent as references, the bytes the
	// row would have taken verbatim minus the reference.
	BytesSaved uint64
	Resets     uint64 // Reset calls
	Evictions  uint64 // rows the model evicted
	Rows       int    // rows the edge is believed to hold now
	Bytes      int64  // their charge
}

// NewTracker returns an empty model of an edge whose budget is cfg.
func NewTracker(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Tracker{model: newLRU(cfg)}, nil
}

// Reset forgets everything the edge was believed to hold and takes cfg as
// its budget from now on: the edge asked (AppendReset), typically because
// it restarted with an empty RowStore.
func (t *Tracker) Reset(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.model.reset(cfg)
	t.stats.Resets++
	return nil
}

// Config returns the budget the model runs with.
func (t *Tracker) Config() Config {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.model.cfg
}

// Stats returns the counters.
func (t *Tracker) Stats() TrackerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.Evictions = t.model.evictions
	s.Rows = t.model.len()
	s.Bytes = t.model.bytes
	return s
}

// AppendRecipe appends res encoded as a recipe for the edge and records
// the delivery in the model: every row the model holds (including a row
// that appeared earlier in res) is sent as its reference, every other
// row verbatim and now believed held.
func (t *Tracker) AppendRecipe(dst []byte, res Result) []byte {
	// Hashing is the expensive part: it runs outside the lock.
	sums := make([]Sum, len(res.Rows))
	for i, row := range res.Rows {
		sums[i] = rowSum(row)
	}
	whole := wholeSum(res.Header, sums)
	refs := make([]bool, len(res.Rows))
	var saved, nrefs uint64

	t.mu.Lock()
	cfg := t.model.cfg
	for i, row := range res.Rows {
		if !cfg.storable(len(row)) {
			continue
		}
		if _, present := t.model.observe(refOf(sums[i]), len(row)); present {
			refs[i] = true
			nrefs++
			saved += uint64(uvarintLen(len(row)) + len(row) - RefSize)
		}
	}
	t.mu.Unlock()

	w := recipeWriter{dst: dst, sums: sums, refs: refs, rows: res.Rows}
	start := len(dst)
	out := w.write(whole, res.Header)

	t.mu.Lock()
	t.stats.Recipes++
	t.stats.RowsReferenced += nrefs
	t.stats.RowsVerbatim += uint64(len(res.Rows)) - nrefs
	t.stats.BytesResult += uint64(res.Size())
	t.stats.BytesSent += uint64(len(out) - start)
	t.stats.BytesSaved += saved
	t.mu.Unlock()
	return out
}

func uvarintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return len(binary.AppendUvarint(b[:0], uint64(n)))
}
