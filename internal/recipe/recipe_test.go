package recipe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// genRows returns n distinct rows of about size bytes.
func genRows(rng *rand.Rand, n, size int) [][]byte {
	rows := make([][]byte, n)
	for i := range rows {
		row := make([]byte, size/2+rng.IntN(size))
		for j := range row {
			row[j] = byte(rng.Uint32())
		}
		rows[i] = row
	}
	return rows
}

func result(rows [][]byte) Result { return Result{Header: []byte("cols: a int4, b text"), Rows: rows} }

func shuffled(rng *rand.Rand, rows [][]byte) [][]byte {
	out := slices.Clone(rows)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// pair is an origin's Tracker and an edge's RowStore over one link, with
// the origin's last result kept to answer refetches.
type pair struct {
	t    *testing.T
	tr   *Tracker
	st   *RowStore
	last Result
	lim  Limits
	asks []Refetch
}

func newPair(t *testing.T, origin, edge Config) *pair {
	t.Helper()
	tr, err := NewTracker(origin)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewRowStore(edge)
	if err != nil {
		t.Fatal(err)
	}
	return &pair{t: t, tr: tr, st: st, lim: DefaultLimits()}
}

func (p *pair) Refetch(_ context.Context, req Refetch) ([]byte, error) {
	p.asks = append(p.asks, req)
	if req.All {
		return AppendVerbatim(nil, p.last), nil
	}
	return AppendFill(nil, p.last, req)
}

// send encodes res at the origin and decodes it at the edge, checking the
// rebuilt result; it returns the recipe's size.
func (p *pair) send(res Result) int {
	p.t.Helper()
	p.last = res
	msg := p.tr.AppendRecipe(nil, res)
	got, err := p.st.Decode(context.Background(), msg, p, p.lim)
	if err != nil {
		p.t.Fatalf("decode: %v", err)
	}
	equalResults(p.t, got, res)
	return len(msg)
}

func equalResults(t *testing.T, got, want Result) {
	t.Helper()
	if !bytes.Equal(got.Header, want.Header) || len(got.Rows) != len(want.Rows) {
		t.Fatalf("rebuilt result: header %q, %d rows; want %q, %d rows", got.Header, len(got.Rows), want.Header, len(want.Rows))
	}
	for i := range got.Rows {
		if !bytes.Equal(got.Rows[i], want.Rows[i]) {
			t.Fatalf("row %d differs", i)
		}
	}
}

func TestRoundTripSecondOrderIsReferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := genRows(rng, 2000, 400)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	first := p.send(result(rows))
	second := p.send(result(shuffled(rng, rows)))
	raw := int(result(rows).Size())
	if first < raw {
		t.Errorf("first recipe %d bytes is smaller than the raw result %d: rows were referenced before being sent", first, raw)
	}
	// 2000 references of 16 bytes, one run, the header and the hash.
	if max := 2000*RefSize + 100; second > max {
		t.Errorf("second recipe is %d bytes, want at most %d", second, max)
	}
	if len(p.asks) != 0 {
		t.Errorf("refetches %v with both sides in step", p.asks)
	}
	ts, ss := p.tr.Stats(), p.st.Stats()
	if ts.RowsReferenced != 2000 || ts.RowsVerbatim != 2000 || ts.Recipes != 2 || ts.BytesSaved == 0 {
		t.Errorf("tracker stats %+v", ts)
	}
	if ss.RowsFromStore != 2000 || ss.RowsVerbatim != 2000 || ss.Recipes != 2 || ss.Refetches != 0 {
		t.Errorf("store stats %+v", ss)
	}
	if !slices.Equal(p.tr.model.order(), p.st.held.order()) {
		t.Error("origin's model and edge's store disagree")
	}
}

func TestEmptyAndHeaderOnlyResults(t *testing.T) {
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.send(Result{})
	p.send(Result{Header: []byte("h")})
	p.send(Result{Rows: [][]byte{{}, {}, nil}})
}

func TestRepeatedRowsWithinOneResultAreSentOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rows := genRows(rng, 10, 200)
	var res [][]byte
	for i := 0; i < 50; i++ {
		res = append(res, rows[i%10])
	}
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.send(result(res))
	ss := p.st.Stats()
	if ss.RowsVerbatim != 10 || ss.RowsFromRecipe != 40 {
		t.Errorf("store stats %+v, want 10 verbatim and 40 from the recipe", ss)
	}
}

func TestShortAndOversizedRowsTravelVerbatim(t *testing.T) {
	cfg := Config{MaxBytes: 4096, MaxRows: 100}
	short := []byte("short row")
	big := bytes.Repeat([]byte{'x'}, 5000)
	res := result([][]byte{short, big, short, big})
	p := newPair(t, cfg, cfg)
	p.send(res)
	p.send(res)
	if s := p.tr.Stats(); s.RowsReferenced != 0 || s.Rows != 0 {
		t.Errorf("tracker stats %+v: short and oversized rows must not be held", s)
	}
	if s := p.st.Stats(); s.Rows != 0 || s.Bytes != 0 {
		t.Errorf("store stats %+v", s)
	}
}

// The edge's budget is smaller than the origin believes: it evicts rows
// the origin will reference. The edge must ask for exactly those, once,
// and end with the right result.
func TestEvictionDisagreementRefetches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rows := genRows(rng, 1000, 300)
	p := newPair(t, DefaultConfig(), Config{MaxBytes: 100 << 10, MaxRows: 1 << 20})
	p.send(result(rows))
	held := p.st.Stats().Rows
	p.send(result(shuffled(rng, rows)))
	if len(p.asks) != 1 || p.asks[0].All {
		t.Fatalf("refetches %+v, want one for rows", p.asks)
	}
	if got, want := len(p.asks[0].Hashes), 1000-held; got != want {
		t.Errorf("asked for %d rows, the edge lacked %d", got, want)
	}
	if s := p.st.Stats(); s.Refetches != 1 || s.RowsMissing != uint64(1000-held) || s.RowsRefetched != uint64(1000-held) || s.FullRefetches != 0 {
		t.Errorf("store stats %+v", s)
	}
}

// A delivery the edge never applied (lost on the way): the next recipe
// references its rows.
func TestLostDeliveryRefetches(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	rows := genRows(rng, 100, 300)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.tr.AppendRecipe(nil, result(rows[:50]))
	p.send(result(rows))
	if len(p.asks) != 1 || len(p.asks[0].Hashes) != 50 {
		t.Fatalf("refetches %+v, want one of 50 rows", p.asks)
	}
	// Healed: the refetched rows are held, so nothing more is asked.
	p.send(result(shuffled(rng, rows)))
	if len(p.asks) != 1 {
		t.Errorf("refetches after healing: %+v", p.asks[1:])
	}
}

func TestEvictedRowIsMissingNeverWrong(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	rows := genRows(rng, 20, 300)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.send(result(rows))
	p.st.mu.Lock()
	p.st.held.remove(HashRow(rows[3]))
	p.st.mu.Unlock()

	msg := p.tr.AppendRecipe(nil, result(rows))
	rc, err := ParseRecipe(msg, p.lim)
	if err != nil {
		t.Fatal(err)
	}
	res, need, err := p.st.Rebuild(rc, nil, p.lim)
	if err != nil || need.All || len(need.Hashes) != 1 || need.Hashes[0] != HashRow(rows[3]) || res.Rows != nil {
		t.Fatalf("Rebuild = %d rows, %+v, %v; want a request for row 3 only", len(res.Rows), need, err)
	}
	// Without an origin to ask, Decode fails rather than guess.
	if _, err := p.st.Decode(context.Background(), msg, nil, p.lim); !errors.Is(err, ErrUnresolved) {
		t.Fatalf("Decode without origin: %v, want ErrUnresolved", err)
	}
	fill, err := AppendFill(nil, result(rows), need)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseFill(fill, p.lim)
	if err != nil {
		t.Fatal(err)
	}
	res, need, err = p.st.Rebuild(rc, f, p.lim)
	if err != nil || !need.Empty() {
		t.Fatalf("Rebuild with fill: %+v, %v", need, err)
	}
	equalResults(t, res, result(rows))
}

func TestWholeHashMismatchRefetchesWholeResult(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	rows := genRows(rng, 10, 300)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.last = result(rows)
	msg := p.tr.AppendRecipe(nil, p.last)
	msg[len(msg)-1] ^= 1 // a bit flipped in the last row's bytes
	got, err := p.st.Decode(context.Background(), msg, p, p.lim)
	if err != nil {
		t.Fatal(err)
	}
	equalResults(t, got, result(rows))
	if len(p.asks) != 1 || !p.asks[0].All {
		t.Errorf("refetches %+v, want one of the whole result", p.asks)
	}
	if s := p.st.Stats(); s.Mismatches != 1 || s.FullRefetches != 1 {
		t.Errorf("store stats %+v", s)
	}

	// An origin answering with another result is refused.
	liar := OriginFunc(func(context.Context, Refetch) ([]byte, error) {
		return AppendVerbatim(nil, result(rows[1:])), nil
	})
	if _, err := p.st.Decode(context.Background(), msg, liar, p.lim); !errors.Is(err, ErrMismatch) {
		t.Errorf("answer for another result: %v, want ErrMismatch", err)
	}
	// A whole answer that is itself corrupt cannot be rebuilt either.
	bad := AppendVerbatim(nil, result(rows))
	bad[len(bad)-1] ^= 1
	corrupt := OriginFunc(func(context.Context, Refetch) ([]byte, error) { return bad, nil })
	if _, err := p.st.Decode(context.Background(), msg, corrupt, p.lim); !errors.Is(err, ErrMismatch) {
		t.Errorf("corrupt whole answer: %v, want ErrMismatch", err)
	}
	failing := OriginFunc(func(context.Context, Refetch) ([]byte, error) { return nil, context.DeadlineExceeded })
	if _, err := p.st.Decode(context.Background(), msg, failing, p.lim); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("failing origin: %v", err)
	}
}

// A 128-bit reference collision: the edge holds another row under the
// reference the origin sends. The whole-result hash catches it, and the
// row delivered verbatim replaces the impostor.
func TestReferenceCollisionIsCaughtAndHealed(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	rows := genRows(rng, 5, 300)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.send(result(rows))

	impostor := genRows(rng, 1, 300)[0]
	forged := rowSum(rows[2])
	forged[SumSize-1] ^= 0xff // same reference, another full hash
	p.st.mu.Lock()
	slot, _ := p.st.held.lookup(HashRow(rows[2]))
	p.st.rows[slot], p.st.sums[slot] = impostor, forged
	p.st.mu.Unlock()

	p.send(result(rows))
	if len(p.asks) != 1 || !p.asks[0].All {
		t.Fatalf("refetches %+v, want one of the whole result", p.asks)
	}
	p.send(result(rows))
	if len(p.asks) != 1 {
		t.Errorf("the impostor was not replaced: refetches %+v", p.asks)
	}
}

func TestResetStartsBothSidesEmpty(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	rows := genRows(rng, 50, 300)
	p := newPair(t, DefaultConfig(), DefaultConfig())
	p.send(result(rows))

	p.st.Reset()
	cfg, err := ParseReset(AppendReset(nil, p.st.Config()))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.tr.Reset(cfg); err != nil {
		t.Fatal(err)
	}
	size := p.send(result(rows))
	if size < int(result(rows).Size()) || len(p.asks) != 0 {
		t.Errorf("after a reset the recipe is %d bytes with refetches %+v: rows were referenced", size, p.asks)
	}
	if s := p.tr.Stats(); s.Resets != 1 || s.Rows != 50 {
		t.Errorf("tracker stats %+v", s)
	}
}

// The model-based check: random deliveries over a small budget; after
// each one the origin's model and the edge's store hold the same rows in
// the same order, within budget, and nothing is ever refetched.
func TestModelsAgreeUnderEviction(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	pool := genRows(rng, 400, 200)
	for _, cfg := range []Config{
		{MaxBytes: 20 << 10, MaxRows: 1000},
		{MaxBytes: 1 << 20, MaxRows: 37},
		{MaxBytes: 8 << 10, MaxRows: 7},
	} {
		t.Run(fmt.Sprintf("%d_bytes_%d_rows", cfg.MaxBytes, cfg.MaxRows), func(t *testing.T) {
			p := newPair(t, cfg, cfg)
			for round := 0; round < 300; round++ {
				res := make([][]byte, rng.IntN(120))
				for i := range res {
					res[i] = pool[rng.IntN(len(pool))]
				}
				p.send(result(res))
				s := p.st.Stats()
				if s.Bytes > cfg.MaxBytes || s.Rows > cfg.MaxRows {
					t.Fatalf("round %d: store holds %d bytes in %d rows over budget %+v", round, s.Bytes, s.Rows, cfg)
				}
				if !slices.Equal(p.tr.model.order(), p.st.held.order()) {
					t.Fatalf("round %d: origin's model and edge's store disagree", round)
				}
			}
			if len(p.asks) != 0 {
				t.Errorf("%d refetches with both sides in step", len(p.asks))
			}
			if p.st.Stats().Evictions == 0 {
				t.Error("the budget never evicted: the test proves nothing")
			}
		})
	}
}

// An origin that restarts forgets its model while the edge keeps its
// store: the edge holds at least what the new model believes, so nothing
// is refetched, and converges to it.
func TestOriginRestartNeedsNoRefetch(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	pool := genRows(rng, 300, 200)
	cfg := Config{MaxBytes: 16 << 10, MaxRows: 1000}
	p := newPair(t, cfg, cfg)
	deliver := func(rounds int) {
		for round := 0; round < rounds; round++ {
			res := make([][]byte, rng.IntN(40))
			for i := range res {
				res[i] = pool[rng.IntN(len(pool))]
			}
			p.send(result(res))
			edge := map[RowHash]bool{}
			for _, h := range p.st.held.order() {
				edge[h] = true
			}
			for _, h := range p.tr.model.order() {
				if !edge[h] {
					t.Fatalf("round %d: the origin believes %s held, the edge lacks it", round, h)
				}
			}
		}
	}
	deliver(50)
	var err error
	if p.tr, err = NewTracker(cfg); err != nil {
		t.Fatal(err)
	}
	deliver(200)
	if len(p.asks) != 0 {
		t.Errorf("%d refetches after an origin restart", len(p.asks))
	}
	if !slices.Equal(p.tr.model.order(), p.st.held.order()) {
		t.Error("the edge did not converge to the origin's model")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{{}, {MaxBytes: 1 << 20}, {MaxBytes: 10, MaxRows: 10}, {MaxBytes: 1 << 20, MaxRows: maxRowsLimit + 1}} {
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg, err)
		}
		if _, err := NewTracker(cfg); err == nil {
			t.Errorf("NewTracker(%+v) accepted", cfg)
		}
		if _, err := NewRowStore(cfg); err == nil {
			t.Errorf("NewRowStore(%+v) accepted", cfg)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
	if err := DefaultLimits().Validate(); err != nil {
		t.Error(err)
	}
	if err := (Limits{MaxRows: -1}).Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("negative limits: %v", err)
	}
}

func TestMessagesRoundTrip(t *testing.T) {
	lim := DefaultLimits()
	hs := []RowHash{{3}, {1}, {2}, {1}}
	req, err := ParseRefetch(Refetch{Hashes: hs}.Append(nil), lim)
	if err != nil || len(req.Hashes) != 3 || req.Hashes[0] != (RowHash{1}) || req.Hashes[2] != (RowHash{3}) {
		t.Errorf("refetch round trip: %+v, %v", req, err)
	}
	if req, err := ParseRefetch(Refetch{All: true}.Append(nil), lim); err != nil || !req.All || len(req.Hashes) != 0 {
		t.Errorf("refetch of all: %+v, %v", req, err)
	}
	if _, err := AppendFill(nil, Result{}, Refetch{All: true}); err == nil {
		t.Error("AppendFill answered a request for the whole result")
	}
	if _, err := AppendFill(nil, result([][]byte{[]byte("a")}), Refetch{Hashes: []RowHash{{9}}}); !errors.Is(err, ErrUnknownRow) {
		t.Errorf("fill of an unknown row: %v", err)
	}
	cfg := Config{MaxBytes: 12345, MaxRows: 67}
	if got, err := ParseReset(AppendReset(nil, cfg)); err != nil || got != cfg {
		t.Errorf("reset round trip: %+v, %v", got, err)
	}
	if _, err := ParseReset(AppendReset(nil, Config{})); !errors.Is(err, ErrConfig) {
		t.Errorf("reset with an empty budget: %v", err)
	}
}

func TestCorruptInputIsRefused(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	rows := genRows(rng, 4, 100)
	tr, _ := NewTracker(DefaultConfig())
	tr.AppendRecipe(nil, result(rows[:2]))
	good := tr.AppendRecipe(nil, result(rows)) // a reference run and a literal run
	lim := DefaultLimits()
	if _, err := ParseRecipe(good, lim); err != nil {
		t.Fatal(err)
	}
	// Every proper prefix is refused.
	for n := 0; n < len(good); n++ {
		if _, err := ParseRecipe(good[:n], lim); err == nil {
			t.Fatalf("prefix of %d bytes accepted", n)
		}
	}
	hdr := []byte{Version, KindRecipe}
	hash := make([]byte, SumSize)
	recipe := func(tail ...byte) []byte { return append(append(append([]byte{}, hdr...), hash...), tail...) }
	cases := []struct {
		name string
		msg  []byte
		lim  Limits
		want error
	}{
		{"version", append([]byte{2}, good[1:]...), lim, ErrVersion},
		{"kind", append([]byte{Version, KindFill}, good[2:]...), lim, ErrKind},
		{"trailing byte", append(slices.Clone(good), 0), lim, ErrCorrupt},
		{"empty run", recipe(0, 1, 0), lim, ErrCorrupt},
		{"run past the row count", recipe(0, 1, 4<<1, 0), lim, ErrCorrupt},
		{"more rows than bytes", recipe(0, 0xff, 0xff, 0xff, 0xff, 0x0f), lim, ErrCorrupt},
		{"row longer than the message", recipe(0, 1, 1<<1, 50, 'x'), lim, ErrCorrupt},
		{"reference cut short", recipe(0, 1, 1<<1|1, 1, 2, 3), lim, ErrCorrupt},
		{"header longer than the message", recipe(9, 'h'), lim, ErrCorrupt},
		{"rows over the limit", recipe(0, 3, 3<<1, 0, 0, 0), Limits{MaxRows: 2, MaxResultBytes: 1 << 20}, ErrTooLarge},
	}
	for _, c := range cases {
		if _, err := ParseRecipe(c.msg, c.lim); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	for _, msg := range [][]byte{
		{Version, KindRefetch, 2, 0},                                    // unknown flag
		{Version, KindRefetch, 1, 1, 0, 0},                              // all with hashes
		{Version, KindRefetch, 0, 2},                                    // hashes missing
		append([]byte{Version, KindRefetch, 0, 2}, make([]byte, 32)...), // repeated hash
	} {
		if _, err := ParseRefetch(msg, lim); !errors.Is(err, ErrCorrupt) {
			t.Errorf("refetch %x: %v, want ErrCorrupt", msg, err)
		}
	}
	for _, msg := range [][]byte{{Version, KindFill, 2, 0}, {Version, KindFill, 1, 5, 'a'}} {
		if _, err := ParseFill(msg, lim); !errors.Is(err, ErrCorrupt) {
			t.Errorf("fill %x: %v, want ErrCorrupt", msg, err)
		}
	}
	if _, err := ParseReset([]byte{Version, KindReset, 0x80}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("reset cut short: %v", err)
	}
}

// A small recipe can name a huge result through references: Rebuild
// refuses it before assembling it.
func TestResultOverLimitIsRefused(t *testing.T) {
	row := bytes.Repeat([]byte{'r'}, 1000)
	res := result([][]byte{row})
	for i := 0; i < 2000; i++ {
		res.Rows = append(res.Rows, row)
	}
	p := newPair(t, DefaultConfig(), DefaultConfig())
	msg := p.tr.AppendRecipe(nil, res)
	if len(msg) > 40<<10 {
		t.Fatalf("recipe of %d bytes: references not used", len(msg))
	}
	lim := Limits{MaxRows: 1 << 20, MaxResultBytes: 1 << 20}
	if _, err := p.st.Decode(context.Background(), msg, p, lim); !errors.Is(err, ErrTooLarge) {
		t.Errorf("result of 2 MB under a 1 MiB limit: %v, want ErrTooLarge", err)
	}
}

func TestLRUOrderAndBudget(t *testing.T) {
	l := newLRU(Config{MaxBytes: 3 * Charge(100), MaxRows: 10})
	h := func(b byte) RowHash { return RowHash{b} }
	for b := byte(1); b <= 3; b++ {
		if _, present := l.observe(h(b), 100); present {
			t.Fatal("new row reported present")
		}
	}
	l.observe(h(1), 100) // 1 becomes the most recent: 2 is next to go
	l.observe(h(4), 100)
	if got, want := l.order(), []RowHash{h(4), h(1), h(3)}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	l.observe(h(5), 250) // needs two slots' worth
	if got, want := l.order(), []RowHash{h(5), h(4)}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if l.bytes != Charge(250)+Charge(100) || l.evictions != 3 {
		t.Errorf("bytes %d, evictions %d", l.bytes, l.evictions)
	}
}

// Concurrent deliveries may reach the store in another order than the
// origin modelled them: that may cost refetches, never a wrong result.
func TestConcurrentDeliveriesStayCorrect(t *testing.T) {
	pool := genRows(rand.New(rand.NewPCG(23, 24)), 200, 200)
	cfg := Config{MaxBytes: 12 << 10, MaxRows: 1000}
	tr, _ := NewTracker(cfg)
	st, _ := NewRowStore(cfg)
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func(seed uint64) {
			rng := rand.New(rand.NewPCG(seed, seed))
			for round := 0; round < 100; round++ {
				rows := make([][]byte, rng.IntN(40))
				for i := range rows {
					rows[i] = pool[rng.IntN(len(pool))]
				}
				res := result(rows)
				origin := OriginFunc(func(_ context.Context, req Refetch) ([]byte, error) {
					if req.All {
						return AppendVerbatim(nil, res), nil
					}
					return AppendFill(nil, res, req)
				})
				got, err := st.Decode(context.Background(), tr.AppendRecipe(nil, res), origin, DefaultLimits())
				if err == nil && !slices.EqualFunc(got.Rows, res.Rows, bytes.Equal) {
					err = fmt.Errorf("round %d: wrong rows", round)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}(uint64(g))
	}
	for g := 0; g < 4; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if s := st.Stats(); s.Bytes > cfg.MaxBytes || s.Recipes != 400 {
		t.Errorf("store stats %+v", s)
	}
}

// A zero budget holds nothing: every row travels verbatim, both sides
// agree, and the result is still verified.
func TestZeroBudgetSendsEveryRowVerbatim(t *testing.T) {
	cfg := Config{MaxBytes: 0, MaxRows: 1}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{MaxBytes: 100, MaxRows: 1}).Validate(); err == nil {
		t.Fatal("a budget below one row's charge was accepted")
	}
	got, err := ParseReset(AppendReset(nil, cfg))
	if err != nil || got != cfg {
		t.Fatalf("reset round trip: %+v, %v", got, err)
	}
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewRowStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := Result{Header: []byte("header"), Rows: [][]byte{bytes.Repeat([]byte("a"), 64), bytes.Repeat([]byte("b"), 64)}}
	for range 2 {
		msg := tr.AppendRecipe(nil, res)
		out, err := st.Decode(context.Background(), msg, OriginFunc(func(context.Context, Refetch) ([]byte, error) {
			t.Fatal("a refetch with nothing held")
			return nil, nil
		}), DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Rows) != 2 || !bytes.Equal(out.Rows[1], res.Rows[1]) {
			t.Fatal("rows differ")
		}
	}
	if s := tr.Stats(); s.RowsReferenced != 0 || s.RowsVerbatim != 4 {
		t.Fatalf("tracker: %+v", s)
	}
	if s := st.Stats(); s.Rows != 0 {
		t.Fatalf("store holds %d rows", s.Rows)
	}
}
