package recipe

import (
	"context"
	"fmt"
	"sync"
)

// RowStore is the edge's row cache: rows received in recipes, named by
// their hashes, held within a Config budget with the LRU policy the
// origin's Tracker simulates. It rebuilds results from recipes and says
// which rows to refetch when it cannot.
//
// A RowStore is safe for concurrent use. Deliveries are applied to it in
// the order their Rebuild calls finish; the origin modelled them in the
// order it encoded them, and a difference only costs refetches.
type RowStore struct {
	mu    sync.Mutex // guards held, rows, sums, stats
	held  *lru       // the eviction model, the same code as the Tracker's
	rows  [][]byte   // by slot: the row's bytes, owned by the store
	sums  []Sum      // by slot: the row's full hash, computed here from rows[slot]
	stats StoreStats
}

// StoreStats are a RowStore's counters since it was made (a Reset does
// not clear them), and what it holds now.
type StoreStats struct {
	Recipes        uint64 // results rebuilt and verified
	RowsVerbatim   uint64 // rows that came as bytes in those recipes
	RowsFromStore  uint64 // references resolved from the store
	RowsFromRecipe uint64 // references resolved to a row earlier in the same recipe
	RowsRefetched  uint64 // references resolved by a fill
	RowsMissing    uint64 // references the store could not resolve, asked for in a refetch
	Refetches      uint64 // refetches of rows asked for
	FullRefetches  uint64 // refetches of a whole result asked for
	Mismatches     uint64 // rebuilt results whose whole-result hash did not match
	Resets         uint64 // Reset calls
	Evictions      uint64 // rows evicted
	Rows           int    // rows held now
	Bytes          int64  // their charge (Config.MaxBytes bounds it)
}

// NewRowStore returns an empty store with budget cfg. The origin must
// track this edge with the same Config (AppendReset carries it).
func NewRowStore(cfg Config) (*RowStore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &RowStore{held: newLRU(cfg)}
	s.held.onEvict = s.drop
	return s, nil
}

// drop releases an evicted slot's row; s.mu is held.
func (s *RowStore) drop(slot int32) {
	s.rows[slot] = nil
	s.sums[slot] = Sum{}
}

// Reset empties the store. Send the origin AppendReset(nil, s.Config())
// with it, so that the origin's model starts empty too.
func (s *RowStore) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held.reset(s.held.cfg)
	s.rows, s.sums = nil, nil
	s.stats.Resets++
}

// Config returns the store's budget.
func (s *RowStore) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held.cfg
}

// Stats returns the counters.
func (s *RowStore) Stats() StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Evictions = s.held.evictions
	st.Rows = s.held.len()
	st.Bytes = s.held.bytes
	return st
}

// Rebuild rebuilds the result rc describes, resolving its references
// against the store, against rows earlier in the recipe, and against
// fill (the answer to an earlier refetch; nil at first).
//
// It returns one of:
//   - the result, verified against the whole-result hash and recorded in
//     the store (need is empty);
//   - need = the hashes it could not resolve: ask the origin for them
//     (AppendFill answers) and call Rebuild again with the fill;
//   - need.All after a whole-result hash mismatch (or a fill that lacked
//     rows): ask for the whole result (AppendVerbatim answers) and
//     rebuild that recipe instead;
//   - an error wrapping ErrTooLarge when the result exceeds lim.
//
// A reference to a row the store evicted therefore never yields a wrong
// result, only a refetch. The result aliases rc and the store's rows.
func (s *RowStore) Rebuild(rc *Recipe, fill *Fill, lim Limits) (res Result, need Refetch, err error) {
	n := len(rc.Parts)
	if n > lim.MaxRows {
		return Result{}, Refetch{}, fmt.Errorf("%w: %d rows, limit %d", ErrTooLarge, n, lim.MaxRows)
	}
	rows := make([][]byte, n)
	sums := make([]Sum, n)
	var unresolved []int
	var literals uint64
	for i := range rc.Parts {
		if p := &rc.Parts[i]; !p.IsRef {
			rows[i] = p.Data
			sums[i] = rowSum(p.Data)
			literals++
		}
	}
	s.mu.Lock()
	for i := range rc.Parts {
		if p := &rc.Parts[i]; p.IsRef {
			if slot, ok := s.held.lookup(p.Ref); ok {
				rows[i], sums[i] = s.rows[slot], s.sums[slot]
			} else {
				unresolved = append(unresolved, i)
			}
		}
	}
	s.mu.Unlock()
	fromStore := uint64(n) - literals - uint64(len(unresolved))

	var fromRecipe, fromFill uint64
	if len(unresolved) > 0 {
		// References the store cannot resolve: rows earlier in this
		// recipe (duplicates), or rows a fill brought.
		local := make(map[RowHash]int, literals)
		for i := range rc.Parts {
			if !rc.Parts[i].IsRef {
				local[refOf(sums[i])] = i
			}
		}
		var filled map[RowHash]int
		var fillSums []Sum
		if fill != nil {
			filled = make(map[RowHash]int, len(fill.Rows))
			fillSums = make([]Sum, len(fill.Rows))
			for j, row := range fill.Rows {
				fillSums[j] = rowSum(row)
				filled[refOf(fillSums[j])] = j
			}
		}
		missing := make(map[RowHash]bool)
		for _, i := range unresolved {
			ref := rc.Parts[i].Ref
			if j, ok := local[ref]; ok {
				rows[i], sums[i] = rows[j], sums[j]
				fromRecipe++
			} else if j, ok := filled[ref]; ok {
				rows[i], sums[i] = fill.Rows[j], fillSums[j]
				fromFill++
			} else {
				missing[ref] = true
			}
		}
		if len(missing) > 0 {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.stats.RowsMissing += uint64(len(missing))
			if fill != nil {
				// The origin did not send what was asked: only the whole
				// result can help now.
				s.stats.FullRefetches++
				return Result{}, Refetch{All: true}, nil
			}
			s.stats.Refetches++
			need.Hashes = make([]RowHash, 0, len(missing))
			for h := range missing {
				need.Hashes = append(need.Hashes, h)
			}
			sortHashes(need.Hashes)
			return Result{}, need, nil
		}
	}

	size := int64(len(rc.Header))
	for _, row := range rows {
		size += int64(len(row))
	}
	if size > lim.MaxResultBytes {
		return Result{}, Refetch{}, fmt.Errorf("%w: result of %d bytes, limit %d", ErrTooLarge, size, lim.MaxResultBytes)
	}
	if wholeSum(rc.Header, sums) != rc.Whole {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.stats.Mismatches++
		s.stats.FullRefetches++
		return Result{}, Refetch{All: true}, nil
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.apply(rows, sums)
	s.stats.Recipes++
	s.stats.RowsVerbatim += literals
	s.stats.RowsFromStore += fromStore
	s.stats.RowsFromRecipe += fromRecipe
	s.stats.RowsRefetched += fromFill
	return Result{Header: rc.Header, Rows: rows}, Refetch{}, nil
}

// apply records a verified delivery the way the Tracker modelled it: every
// storable row in order becomes the most recently used, inserted (copied)
// if absent; s.mu is held.
func (s *RowStore) apply(rows [][]byte, sums []Sum) {
	cfg := s.held.cfg
	for i, row := range rows {
		if !cfg.storable(len(row)) {
			continue
		}
		slot, present := s.held.observe(refOf(sums[i]), len(row))
		if int(slot) == len(s.rows) {
			s.rows = append(s.rows, nil)
			s.sums = append(s.sums, Sum{})
		}
		// A present row with another full hash is a reference collision
		// that a whole-result refetch just resolved: the newer row wins.
		if !present || s.sums[slot] != sums[i] {
			s.rows[slot] = append(make([]byte, 0, len(row)), row...)
			s.sums[slot] = sums[i]
		}
	}
}

// Origin answers an edge's refetch for the recipe being decoded: a fill
// (AppendFill) for hashes, the whole result as a verbatim recipe
// (AppendVerbatim) for All.
type Origin interface {
	Refetch(ctx context.Context, req Refetch) ([]byte, error)
}

// OriginFunc adapts a function to Origin.
type OriginFunc func(ctx context.Context, req Refetch) ([]byte, error)

// Refetch calls f.
func (f OriginFunc) Refetch(ctx context.Context, req Refetch) ([]byte, error) { return f(ctx, req) }

// Decode parses a recipe message and rebuilds its result, asking origin
// for what the store lacks: one batched refetch of rows, and only after a
// whole-result hash mismatch (or a fill that lacked rows) the whole result
// verbatim. origin may be nil when no refetch is possible; a recipe that
// needs one then fails with ErrUnresolved.
func (s *RowStore) Decode(ctx context.Context, msg []byte, origin Origin, lim Limits) (Result, error) {
	rc, err := ParseRecipe(msg, lim)
	if err != nil {
		return Result{}, err
	}
	res, need, err := s.Rebuild(rc, nil, lim)
	if err != nil || need.Empty() {
		return res, err
	}
	if origin == nil {
		return Result{}, fmt.Errorf("%w: %d rows missing and no origin to ask", ErrUnresolved, len(need.Hashes))
	}
	if !need.All {
		b, err := origin.Refetch(ctx, need)
		if err != nil {
			return Result{}, fmt.Errorf("recipe: refetch of %d rows: %w", len(need.Hashes), err)
		}
		fill, err := ParseFill(b, lim)
		if err != nil {
			return Result{}, err
		}
		if res, need, err = s.Rebuild(rc, fill, lim); err != nil || need.Empty() {
			return res, err
		}
	}
	b, err := origin.Refetch(ctx, Refetch{All: true})
	if err != nil {
		return Result{}, fmt.Errorf("recipe: refetch of the whole result: %w", err)
	}
	whole, err := ParseRecipe(b, lim)
	if err != nil {
		return Result{}, err
	}
	if whole.Whole != rc.Whole {
		return Result{}, fmt.Errorf("%w: the whole result the origin sent is %s, not %s", ErrMismatch, whole.Whole, rc.Whole)
	}
	if k := whole.Refs(); k > 0 {
		return Result{}, fmt.Errorf("%w: the whole result holds %d references", ErrCorrupt, k)
	}
	res, need, err = s.Rebuild(whole, nil, lim)
	if err == nil && !need.Empty() {
		err = fmt.Errorf("%w: rows sent verbatim", ErrMismatch)
	}
	return res, err
}
