package main

import "testing"

// The default listen addresses stay apart whatever the number of
// cache-nodes (make demo runs two, whose second took the front's metrics
// port: "front metrics: bind: address already in use").
func TestDefaultAddressesDoNotCollide(t *testing.T) {
	cfg := DefaultConfig()
	for nodes := 1; nodes <= 16; nodes++ {
		seen := map[string]string{
			cfg.InvalidatorMetrics: "the invalidator's metrics",
			cfg.FrontMetrics:       "the front's metrics",
		}
		if len(seen) != 2 {
			t.Fatalf("the invalidator's and the front's metrics share %s", cfg.FrontMetrics)
		}
		for i := range nodes {
			addr, err := nthAddr(cfg.CacheNodeMetrics, i)
			if err != nil {
				t.Fatal(err)
			}
			if other, ok := seen[addr]; ok {
				t.Fatalf("with %d cache-nodes, node %d's metrics take %s, %s", nodes, i+1, addr, other)
			}
			seen[addr] = "a cache-node's metrics"
		}
	}
}
