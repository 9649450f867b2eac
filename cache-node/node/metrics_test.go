package node

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/store"
)

// TestTemplateMetrics puts and looks up through a running node and reads
// the per-template counters: lookups by result, puts, and bytes put as the
// byte budget counts them.
func TestTemplateMetrics(t *testing.T) {
	h := newHarness(t)
	h.waitWatermark(1000)
	ctx := context.Background()
	const tpl = "0123456789abcdef"
	dep := store.Dep{Tag: "public.items(id)=1", Table: "public.items", Reads: []string{"id"}}
	if r, err := h.n.Lookup(ctx, []byte("k"), 1000, 1000, tpl); err != nil || r.Miss != store.MissCompulsory {
		t.Fatalf("first lookup: %+v, %v", r, err)
	}
	req := PutRequest{Key: []byte("k"), Snapshot: 1000, Deps: []store.Dep{dep}, Value: []byte("a result"), Template: tpl}
	if err := h.n.Put(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.n.m.templatePuts.WithLabelValues(tpl)); got != 1 {
		t.Errorf("template puts = %v, want 1", got)
	}
	v := store.Version{Deps: req.Deps, Value: req.Value}
	if got, want := testutil.ToFloat64(h.n.m.templatePutBytes.WithLabelValues(tpl)), float64(v.Size(len(req.Key))); got != want {
		t.Errorf("template bytes put = %v, want %v", got, want)
	}
	if got := testutil.ToFloat64(h.n.m.byTemplate.WithLabelValues(tpl, "compulsory")); got != 1 {
		t.Errorf("compulsory lookups of the template = %v, want 1", got)
	}
	// A put without a template is counted in all only.
	before := testutil.ToFloat64(h.n.m.puts)
	if err := h.n.Put(ctx, PutRequest{Key: []byte("k2"), Snapshot: 1000, Deps: []store.Dep{dep}, Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.n.m.puts); got != before+1 {
		t.Errorf("puts = %v, want %v", got, before+1)
	}
	if got := testutil.CollectAndCount(h.n.m.templatePuts); got != 1 {
		t.Errorf("template put series = %d, want 1 (no empty template label)", got)
	}
}

// TestTemplateLabelBound: past maxTemplates distinct templates, lookups
// and puts of new ones share the label "other"; the templates seen first
// keep theirs.
func TestTemplateLabelBound(t *testing.T) {
	m := newMetrics(nil, nil)
	for i := range maxTemplates {
		m.lookup(store.Hit, fmt.Sprintf("t%d", i))
	}
	m.put("late", 100)
	m.lookup(store.MissStaleness, "later")
	m.put("t0", 10)
	if got := testutil.ToFloat64(m.templatePuts.WithLabelValues("other")); got != 1 {
		t.Errorf("puts of other = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.templatePutBytes.WithLabelValues("other")); got != 100 {
		t.Errorf("bytes put of other = %v, want 100", got)
	}
	if got := testutil.ToFloat64(m.byTemplate.WithLabelValues("other", "staleness")); got != 1 {
		t.Errorf("staleness lookups of other = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.templatePuts.WithLabelValues("t0")); got != 1 {
		t.Errorf("puts of t0 = %v, want 1 (an early template keeps its label)", got)
	}
	if got := testutil.CollectAndCount(m.byTemplate); got != maxTemplates+1 {
		t.Errorf("lookup series = %d, want %d", got, maxTemplates+1)
	}
}
