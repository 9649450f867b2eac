package larder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fxamacker/cbor/v2"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/qumaana/quma"
)

// Function is a cacheable function (TxCache's programming model): a
// computation over the database — a page fragment, an object built from
// several queries — cached as one entry. Called inside a read-only
// transaction, a miss runs the function; every query it makes goes through
// the transaction as usual (L1, cache-node, PostgreSQL at its pin), so the
// result equals the function at one snapshot. The entry's validity is the
// intersection of everything it read (the transaction's candidates after
// its reads) and its tags the union of theirs; a hit narrows the
// transaction like a query's. Nested calls compose: a function called by
// another adds its tags to the caller's entry, hit or miss.
//
// The key is the function's name, the session's key scope (role,
// settings) and the argument, encoded with CBOR's core deterministic
// encoding (RFC 8949 §4.2: map keys sorted, shortest forms); the result is
// stored in CBOR too. A and R must therefore encode deterministically and
// completely: exported fields of plain types. A function that reads
// something uncacheable (an uncacheable statement, a clock-bound query, a
// table the invalidator does not cover, a fallback transaction) is run but
// not cached, and the reason is counted
// (larder_client_function_calls_total{outcome="uncacheable"} and
// larder_client_uncacheable_total).
//
// A function must be deterministic in its argument and what it reads
// through the transaction: it must not read the clock, random numbers,
// or anything outside the transaction.
type Function[A, R any] struct {
	name string
	fn   func(ctx context.Context, tx *ROTx, arg A) (R, error)
}

// NewFunction names a cacheable function. The name is part of the key:
// change it when the function's code changes what it returns.
func NewFunction[A, R any](name string, fn func(ctx context.Context, tx *ROTx, arg A) (R, error)) *Function[A, R] {
	return &Function[A, R]{name: name, fn: fn}
}

// Name is the function's name.
func (f *Function[A, R]) Name() string { return f.name }

// functionValueVersion is the first field of a cached function's value.
const functionValueVersion = 1

// functionValue is what a function's entry holds: its tags (so that a hit
// adds them to a calling function's entry) and its result.
type functionValue struct {
	_    struct{} `cbor:",toarray"`
	V    int
	Tags []quma.QueryTag
	R    cbor.RawMessage
}

var (
	detEnc, _ = cbor.CoreDetEncOptions().EncMode()
	// decoding is bounded: a corrupt entry is a miss, never a huge
	// allocation.
	funcDec, _ = cbor.DecOptions{MaxArrayElements: 1 << 20, MaxMapPairs: 1 << 20, MaxNestedLevels: 64}.DecMode()
)

// frame records what a function running in a transaction read.
type frame struct {
	tags        []quma.QueryTag
	uncacheable string // the first reason, "" if none
}

// noteRead adds a result's tags to every running function.
func (t *ROTx) noteRead(qtags []quma.QueryTag) {
	for _, f := range t.frames {
		f.tags = append(f.tags, qtags...)
	}
}

// noteUncacheable marks every running function uncacheable.
func (t *ROTx) noteUncacheable(reason string) {
	for _, f := range t.frames {
		if f.uncacheable == "" {
			f.uncacheable = reason
		}
	}
}

// Call returns f(arg) as of the transaction's snapshot: from the L1 or the
// key's cache-node when an entry valid at one of the transaction's
// candidate snapshots exists, else by running the function (and caching
// its result when everything it read was cacheable).
func (f *Function[A, R]) Call(ctx context.Context, tx *ROTx, arg A) (R, error) {
	var zero R
	if tx == nil || tx.done {
		return zero, errors.New("larder: a cacheable function needs an open read-only transaction")
	}
	t := tx
	argBytes, err := detEnc.Marshal(arg)
	if err != nil {
		t.noteUncacheable("function argument: " + err.Error())
		t.c.m.functionCalls.WithLabelValues("uncacheable").Inc()
		t.c.m.uncacheable("function argument cannot be encoded")
		return f.fn(ctx, t, arg)
	}
	if err := t.settle(ctx, t.c.cfg.FreshReadWait, true); err != nil {
		return zero, err
	}
	var key []byte
	if !t.fallback && !t.scope.temp && t.placing == nil {
		key, err = t.c.key(t.scope.key+"\nfunction", "larder-function:"+f.name, []any{argBytes})
	}
	if key == nil || err != nil {
		return f.run(ctx, t, arg, nil)
	}
	if r, ok := f.lookup(ctx, t, key); ok {
		// A result was returned: the snapshot can no longer move (a
		// transaction whose pins are all gone must not take a fresh one).
		t.returned = true
		return r, nil
	}
	return f.run(ctx, t, arg, key)
}

// lookup looks for the function's entry in the L1, then on the key's
// cache-node, valid somewhere in the transaction's candidates.
func (f *Function[A, R]) lookup(ctx context.Context, t *ROTx, key []byte) (R, bool) {
	var zero R
	tmin, tmax := t.Range()
	decode := func(b []byte) (R, []quma.QueryTag, bool) {
		var v functionValue
		var r R
		if err := funcDec.Unmarshal(b, &v); err != nil || v.V != functionValueVersion {
			return zero, nil, false
		}
		if err := funcDec.Unmarshal(v.R, &r); err != nil {
			return zero, nil, false
		}
		return r, v.Tags, true
	}
	if t.c.l1 != nil {
		if e, err := t.c.l1Lookup(ctx, key, tmin, tmax, "function:"+f.name); err == nil && e.Miss == store.Hit {
			if r, tags, ok := decode(e.Value); ok && t.narrow(e.Lo, e.Hi) {
				t.noteRead(tags)
				t.c.m.functionCalls.WithLabelValues("l1").Inc()
				t.c.stats.FunctionHits.Add(1)
				return r, true
			}
		}
	}
	node := t.c.node(key)
	if node == nil {
		return zero, false
	}
	e, asked, err := node.lookupCounted(ctx, &protocol.LookupRequest{Key: key, TMin: tmin, TMax: tmax, Template: "function:" + f.name}, t.c.l1 != nil)
	if !asked || err != nil || e.Miss != store.Hit {
		return zero, false
	}
	r, tags, ok := decode(e.Value)
	if !ok || !t.narrow(e.Lo, e.Hi) {
		return zero, false
	}
	if t.c.l1 != nil {
		t.c.l1Keep(ctx, key, e.Lo, e.Hi, e.Snapshot, e.Value)
	}
	t.noteRead(tags)
	t.c.m.functionCalls.WithLabelValues("node").Inc()
	t.c.stats.FunctionHits.Add(1)
	return r, true
}

// run runs the function, recording what it reads, and caches its result
// under key (nil: not cached) when everything it read was cacheable.
func (f *Function[A, R]) run(ctx context.Context, t *ROTx, arg A, key []byte) (R, error) {
	var zero R
	fr := &frame{}
	if key == nil {
		fr.uncacheable = "the transaction reads uncached (no usable pin, or temporary tables)"
	}
	t.frames = append(t.frames, fr)
	t.c.stats.FunctionRuns.Add(1)
	r, err := f.fn(ctx, t, arg)
	t.frames = slices.DeleteFunc(t.frames, func(x *frame) bool { return x == fr })
	if err != nil {
		t.noteUncacheable("a cacheable function failed")
		return zero, err
	}
	// What the function read, the functions calling it read too.
	t.noteRead(fr.tags)
	if fr.uncacheable != "" {
		t.noteUncacheable(fr.uncacheable)
		t.c.m.functionCalls.WithLabelValues("uncacheable").Inc()
		t.c.m.uncacheable("function " + f.name + ": " + fr.uncacheable)
		return r, nil
	}
	t.c.m.functionCalls.WithLabelValues("run").Inc()
	rb, err := detEnc.Marshal(r)
	if err != nil {
		t.c.m.uncacheable("function result cannot be encoded")
		return r, nil
	}
	tags := mergeTags(fr.tags)
	value, err := detEnc.Marshal(functionValue{V: functionValueVersion, Tags: tags, R: rb})
	if err != nil {
		return r, nil
	}
	// Every result the function read is valid at each remaining candidate
	// (hits narrowed to them; a miss fixed the transaction at one).
	if t.placing != nil || t.fallback {
		return r, nil // no timestamp to cache it at
	}
	s := t.ts
	if !t.fixed {
		if len(t.cands) == 0 {
			return r, nil
		}
		s = t.cands[len(t.cands)-1].LSN
	}
	if t.c.l1 != nil {
		t.c.l1Keep(ctx, key, s, s+1, s, value)
	}
	node := t.c.node(key)
	if node == nil || !node.usable() {
		return r, nil
	}
	if !t.c.keying.Load().publishedAt(tags, s) {
		t.c.m.earlyPuts.Inc()
		return r, nil
	}
	deps := make([]store.Dep, 0, len(tags))
	for _, q := range tags {
		deps = append(deps, store.Dep{Tag: q.Tag.String(), Table: q.Table, Reads: q.Reads, AllColumns: q.AllColumns})
	}
	put := &protocol.PutRequest{Key: key, Snapshot: s, Deps: deps, Template: "function:" + f.name, Value: value}
	t.c.puts.Add(1)
	go func() {
		defer t.c.puts.Done()
		_ = node.put(context.Background(), put) // failures are counted by the node client
	}()
	return r, nil
}

// mergeTags merges the tags read into one per tag name: the union of the
// columns read, all columns if any read all.
func mergeTags(in []quma.QueryTag) []quma.QueryTag {
	byName := map[string]int{}
	var out []quma.QueryTag
	for _, q := range in {
		name := q.Tag.String()
		i, ok := byName[name]
		if !ok {
			byName[name] = len(out)
			q.Reads = slices.Clone(q.Reads)
			out = append(out, q)
			continue
		}
		m := &out[i]
		m.AllColumns = m.AllColumns || q.AllColumns
		for _, c := range q.Reads {
			if !slices.Contains(m.Reads, c) {
				m.Reads = append(m.Reads, c)
			}
		}
	}
	for i := range out {
		slices.Sort(out[i].Reads)
	}
	slices.SortFunc(out, func(a, b quma.QueryTag) int { return strings.Compare(a.Tag.String(), b.Tag.String()) })
	return out
}

// String describes a function for logs.
func (f *Function[A, R]) String() string { return fmt.Sprintf("larder.Function(%s)", f.name) }
