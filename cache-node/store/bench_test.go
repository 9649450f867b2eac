package store_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/store"
)

func heapInUse() uint64 { h, _ := heapNow(); return h }

// heapNow collects twice and returns the live heap's bytes and objects.
func heapNow() (bytes, objects uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.HeapObjects
}

// markTime is the CPU time one collection takes (median of five): with a
// large live heap, mostly marking it.
func markTime() time.Duration {
	var ds []time.Duration
	for range 5 {
		start := cpuTime()
		runtime.GC()
		ds = append(ds, cpuTime()-start)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// cpuTime is the process's CPU time (user and system) so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMemoryOverhead measures what a version really costs on the heap
// (beyond its value) against what the budget accounts for it, and what it
// costs the garbage collector: the heap objects it takes (each one marked
// in every collection) and the time a collection takes with the store
// alive, less the time without it (gc-cpu-ns/version, CPU time).
func BenchmarkMemoryOverhead(b *testing.B) {
	const n = 200000
	for _, valSize := range []int{100, 1000} {
		b.Run(fmt.Sprintf("value=%dB", valSize), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				m := store.NewMemory(1<<40, nil)
				before, objsBefore := heapNow()
				gcBefore := markTime()
				val := make([]byte, valSize)
				for k := 0; k < n; k++ {
					deps := []store.Dep{{Tag: fmt.Sprintf("public.items(id)=%d", k), Table: "public.items", Reads: []string{"id", "name"}}}
					_ = m.Put(context.Background(), []byte(fmt.Sprintf("key-%08d", k)), &store.Version{Lo: 1, Hi: store.Open, Snapshot: uint64(k + 1), Deps: deps, Value: val})
				}
				after, objsAfter := heapNow()
				gcAfter := markTime()
				st, _ := m.Stats(context.Background())
				heap := float64(after-before) / n
				b.ReportMetric(float64(objsAfter-objsBefore)/n, "objects/version")
				b.ReportMetric(float64(gcAfter-gcBefore)/n, "gc-cpu-ns/version")
				acct := float64(st.Bytes) / n
				b.ReportMetric(heap-float64(valSize), "heap-overhead-B/version")
				b.ReportMetric(acct-float64(valSize), "accounted-overhead-B/version")
				b.ReportMetric(heap/acct, "heap/accounted")
				runtime.KeepAlive(m)
			}
		})
	}
}

// BenchmarkBudgetUnderChurn fills a budget many times over with versions
// of mixed sizes and reports the heap actually used against the budget.
func BenchmarkBudgetUnderChurn(b *testing.B) {
	const budget = 32 << 20
	for i := 0; i < b.N; i++ {
		m := store.NewMemory(budget, nil)
		before := heapInUse()
		for k := 0; k < 400000; k++ {
			size := 64 << (k % 6) // 64 B … 2 KiB
			deps := []store.Dep{{Tag: fmt.Sprintf("public.items(id)=%d", k%5000), Table: "public.items", Reads: []string{"name"}}}
			_ = m.Put(context.Background(), []byte(fmt.Sprintf("key-%d", k%100000)), &store.Version{Lo: 1, Hi: store.Open, Snapshot: uint64(k + 1), Deps: deps, Value: make([]byte, size)})
		}
		after := heapInUse()
		st, _ := m.Stats(context.Background())
		b.ReportMetric(float64(after-before)/budget, "heap/budget")
		b.ReportMetric(float64(st.Bytes)/budget, "accounted/budget")
		b.ReportMetric(float64(st.Evictions), "evictions")
		runtime.KeepAlive(m)
	}
}
