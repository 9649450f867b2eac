package larder

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/store"
)

// TestTemplateReadsBound: reads are counted by template and source; past
// maxTemplates distinct templates new ones share "other", and the first
// ones keep their labels.
func TestTemplateReadsBound(t *testing.T) {
	m := newClientMetrics(nil)
	for i := range maxTemplates {
		m.templateRead(fmt.Sprintf("t%d", i), "database")
	}
	m.templateRead("t0", "l1")
	m.templateRead("late", "node")
	m.templateRead("", "node") // no template: not counted
	if got := testutil.ToFloat64(m.templateReads.WithLabelValues("t0", "l1")); got != 1 {
		t.Errorf("t0 l1 reads = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.templateReads.WithLabelValues("other", "node")); got != 1 {
		t.Errorf("other node reads = %v, want 1", got)
	}
	if got, want := testutil.CollectAndCount(m.templateReads), maxTemplates+2; got != want {
		t.Errorf("series = %d, want %d", got, want)
	}
}

// TestMetricsRegistry: the registry for tools holds the client's metrics,
// the per-template reads among them.
func TestMetricsRegistry(t *testing.T) {
	n, err := testutil.GatherAndCount(MetricsRegistry(), "larder_client_reads_total", "larder_client_template_reads_total")
	if err != nil {
		t.Fatal(err)
	}
	// larder_client_reads_total has its three sources; the template
	// counter has no series until a read.
	if n != 3 {
		t.Errorf("series = %d, want 3", n)
	}
}

// TestTemplateMissesBound: misses are counted by template, cache and
// class, under the same template bound as the reads, and read back by
// templateMissCounts.
func TestTemplateMissesBound(t *testing.T) {
	m := newClientMetrics(nil)
	for i := range maxTemplates {
		m.templateRead(fmt.Sprintf("t%d", i), "database")
	}
	m.templateMiss("t0", "l1", store.MissCompulsory)
	m.templateMiss("t0", "l1", store.MissStaleness)
	m.templateMiss("t0", "node", store.MissStaleness)
	m.templateMiss("late", "l1", store.MissCapacity)
	m.templateMiss("", "l1", store.MissCapacity) // no template: not counted
	got := m.templateMissCounts()
	want := map[string]map[string]int64{
		"t0":    {"l1 compulsory": 1, "l1 staleness": 1, "node staleness": 1},
		"other": {"l1 capacity": 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("misses = %v, want %v", got, want)
	}
}
