package wan

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/larderdb/larder/bench/rubis/datagen"
	"github.com/larderdb/larder/internal/testenv"
)

// tiny is RUBiS at a few hundred rows.
var tiny = datagen.Size{Users: 300, ActiveItems: 120, OldItems: 200, Categories: 20, Regions: 62, MaxDescription: 400, MaxComment: 100}

func startTestSite(t *testing.T) *Site {
	t.Helper()
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := StartSite(ctx, SiteConfig{Dir: filepath.Join(dir, "site"), Size: tiny})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// The harness itself, briefly: every configuration and mix across one
// small link (bandwidth and delay both in the path), with tiny data. No
// timing is asserted: only that each run served pages, that the link
// carried and counted their bytes, and that the Larder configurations'
// misses went through the origin (verbatim in origin-rows, with rows
// referenced in origin-recipes).
func TestHarnessBriefly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, NATS and the invalidator")
	}
	for _, leaf := range []bool{false, true} {
		name := "nats-over-link"
		if leaf {
			name = "leaf-node"
		}
		t.Run(name, func(t *testing.T) {
			s := startTestSite(t)
			cfg := Config{PGURL: s.PGURL, NATSURL: s.NATS.URL(), NATSClientSeed: s.Seed("client"), NATSNodeSeed: s.Seed("cache-node"),
				QUMA: s.QUMA, Size: tiny, Settings: []Setting{{Name: "test", Mbps: 50, RTT: 4 * time.Millisecond}},
				VUs: 2, Duration: 700 * time.Millisecond, Warmup: 300 * time.Millisecond, BidEvery: 50 * time.Millisecond, Dir: t.TempDir()}
			if leaf {
				cfg.Leaf = s.Leaf()
				cfg.Modes = []string{ModeOriginRecipes}
			}
			runs, err := Bench(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Modes) == 0 {
				cfg.Modes = Modes
			}
			if len(runs) != len(cfg.Modes)*3 {
				t.Fatalf("%d runs", len(runs))
			}
			statements := map[string]int64{}
			for _, r := range runs {
				t.Logf("%s %s %s: %d requests (%d errors), %.0f req/s, %d WAN bytes %v, origin %+v, reads %v", r.Setting, r.Mode, r.Mix, r.Requests, r.Errors, r.Rate, r.WANBytes, r.WAN, r.Origin, r.Reads)
				if r.Requests == 0 || r.WANBytes == 0 {
					t.Errorf("%s %s: no requests or no bytes over the link", r.Mode, r.Mix)
				}
				if r.Errors > r.Requests/10 {
					t.Errorf("%s %s: %d of %d requests failed", r.Mode, r.Mix, r.Errors, r.Requests)
				}
				switch {
				case r.Mode == ModeDirect:
					if r.WAN["postgres"][1] == 0 {
						t.Errorf("direct %s: nothing came from PostgreSQL over the link", r.Mix)
					}
					continue
				case r.Origin == nil:
					t.Fatalf("%s %s: no origin figures", r.Mode, r.Mix)
				case r.Mode == ModeOriginRows && (r.Origin.Store.Rows > 0 || r.Origin.Store.RowsFromStore+r.Origin.Store.RowsFromRecipe > 0):
					t.Errorf("origin-rows %s: rows held or referenced without a row store: %+v", r.Mix, r.Origin.Store)
				}
				if leaf && r.WAN["nats-leaf"][1] == 0 {
					t.Errorf("%s: nothing came over the leaf connection", r.Mix)
				}
				statements[r.Mode] += r.Origin.Statements
			}
			for _, m := range cfg.Modes {
				if m != ModeDirect && statements[m] == 0 {
					t.Errorf("%s: no statement went through the origin", m)
				}
			}
			t.Log("\n" + Markdown(runs))
		})
	}
}
