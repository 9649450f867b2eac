package larder

import (
	"hash/fnv"
	"strings"
	"testing"
	"time"
)

func TestPlacements(t *testing.T) {
	all := func(int) bool { return true }
	keys := [][]byte{[]byte("a"), []byte("bb"), []byte("ccc"), {0, 1, 2, 3}}
	for _, k := range keys {
		h := fnv.New32a()
		h.Write(k)
		if got, want := HashPlacement().Node(k, 3, all), int(h.Sum32()%3); got != want {
			t.Errorf("hash placement of %q: %d, want %d (fnv32a %% 3, as before the seam)", k, got, want)
		}
		if got := HomePlacement().Node(k, 3, all); got != 0 {
			t.Errorf("home placement of %q: %d, want the home node 0", k, got)
		}
	}
	for _, c := range []struct {
		usable []bool
		want   int
	}{
		{[]bool{false, true, true}, 1},  // the home's breaker is open: the next serves
		{[]bool{false, false, true}, 2}, // and the one after
		{[]bool{false, false, false}, 0},
		{[]bool{true, false, true}, 0},
	} {
		if got := HomePlacement().Node(nil, 3, func(i int) bool { return c.usable[i] }); got != c.want {
			t.Errorf("home placement with usable %v: %d, want %d", c.usable, got, c.want)
		}
	}
	if HashPlacement().Node(nil, 0, all) != -1 || HomePlacement().Node(nil, 0, all) != -1 {
		t.Error("no nodes: want -1")
	}
	if _, err := ParsePlacement("nearest"); err == nil {
		t.Error("an unknown placement was accepted")
	}
}

func TestPlacementDSN(t *testing.T) {
	base := "postgres://h/db?larder.nats=n&larder.quma=q"
	cfg, err := ParseDSN(base + "&larder.node-placement=home&larder.miss-wait=20ms")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Placement.(homePlacement); !ok || cfg.MissWait != 20*time.Millisecond {
		t.Fatalf("placement %T, miss wait %v", cfg.Placement, cfg.MissWait)
	}
	if cfg, err := ParseDSN(base + "&larder.miss-wait=0s"); err != nil || cfg.MissWait >= 0 {
		t.Fatalf("larder.miss-wait=0s: %v, %v; want no wait (< 0)", cfg.MissWait, err)
	}
	if cfg, err := ParseDSN(base); err != nil || cfg.Placement != nil {
		t.Fatalf("default placement %T, %v; want nil (hash)", cfg.Placement, err)
	}
	for param, want := range map[string]string{
		"larder.node-placement=nearest": "larder.node-placement",
		"larder.miss-wait=5s":           "larder.miss-wait",
		"larder.miss-wait=soon":         "larder.miss-wait",
	} {
		if _, err := ParseDSN(base + "&" + param); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", param, err, want)
		}
	}
}
