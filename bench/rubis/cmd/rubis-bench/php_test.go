package main

import "testing"

// The PHP modes: php-direct is a direct-style mode (no staleness sweep, no
// cache reads); neither can name another PostgreSQL with --mode-url.
func TestPHPModes(t *testing.T) {
	b := &bench{urls: modeURLs{}}
	if !isPHPMode("php-direct") || !isPHPMode("php-larder") || !isPHPMode("php-larder-l1") || isPHPMode("larder") || isPHPMode("direct") {
		t.Error("isPHPMode")
	}
	if !b.direct("php-direct") || b.direct("php-larder") {
		t.Error("php-direct runs on PostgreSQL directly, php-larder does not")
	}
	if b.reads(variant{mode: "php-direct"}) != nil || b.reads(variant{mode: "php-larder"}) != nil {
		t.Error("no reads without a running front")
	}
	b.phpReads = func() map[string]int64 { return map[string]int64{"node": 3} }
	if r := b.reads(variant{mode: "php-larder"}); r["node"] != 3 {
		t.Errorf("php-larder's reads: %v", r)
	}
	for _, name := range []string{"php-direct", "php-larder", "php-larder-l1"} {
		if err := (modeURLs{}).Set(name + "=postgres://127.0.0.1/x"); err == nil {
			t.Errorf("--mode-url %s=… was accepted", name)
		}
	}
	// The PHP server and its workers (this process's children) count as
	// the application, k6 still does not.
	dir := t.TempDir()
	writeProc(t, dir, 300, 1, "rubis-bench", 400, 100, 777, 111)
	writeProc(t, dir, 310, 300, "k6", 900, 100, 0, 0)
	writeProc(t, dir, 320, 300, "php", 10, 10, 5, 5)
	writeProc(t, dir, 321, 320, "php", 200, 50, 0, 0)
	writeProc(t, dir, 322, 320, "php", 100, 40, 0, 0)
	m := cpuMeter{procDir: dir, self: 300, app: 320}
	if g := m.sample(); !near(g["app"], (400+100+10+10+5+5+200+50+100+40)/100.0) {
		t.Errorf("app %.2f s", g["app"])
	}
	m.app = 0
	if g := m.sample(); !near(g["app"], 5) {
		t.Errorf("without the PHP server, app %.2f s", g["app"])
	}
}
