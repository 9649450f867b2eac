package wan

import (
	"fmt"
	"strings"
)

// Markdown renders runs as one table per mix: each setting's
// configurations side by side, with the ratios the goals are
// stated in (throughput against (a), and (c) against (b)).
func Markdown(runs []Run) string {
	var b strings.Builder
	var mixes []string
	for _, r := range runs {
		if !contains(mixes, r.Mix) {
			mixes = append(mixes, r.Mix)
		}
	}
	for _, m := range mixes {
		fmt.Fprintf(&b, "### %s\n\n", mixTitle(m))
		b.WriteString("| link | configuration | req/s | vs (a) | vs (b) | mean ms | p90 ms | WAN KB/req (to edge + from edge) | WAN MB | hit rate | origin: raw → received |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range runs {
			if r.Mix != m {
				continue
			}
			vsA, vsB := "", ""
			if a := find(runs, r.Setting, ModeDirect, m); a != nil && a.Rate > 0 {
				vsA = fmt.Sprintf("%.2f×", r.Rate/a.Rate)
			}
			if bb := find(runs, r.Setting, ModeOriginRows, m); bb != nil && bb.Rate > 0 && r.Mode != ModeDirect {
				vsB = fmt.Sprintf("%.2f×", r.Rate/bb.Rate)
			}
			req := max(float64(r.Requests), 1)
			var down, up int64
			for _, v := range r.WAN {
				up, down = up+v[0], down+v[1]
			}
			hit, orig := "—", "—"
			if r.Reads != nil {
				h := r.Reads["l1"] + r.Reads["node"]
				if all := h + r.Reads["database"]; all > 0 {
					hit = fmt.Sprintf("%.0f%%", 100*float64(h)/float64(all))
				}
			}
			if o := r.Origin; o != nil && o.BytesRaw > 0 {
				orig = fmt.Sprintf("%.1f → %.1f MB (%.1f%%)", float64(o.BytesRaw)/1e6, float64(o.BytesReceived)/1e6, 100*float64(o.BytesReceived)/float64(o.BytesRaw))
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %s | %.1f | %.1f | %.1f + %.1f | %.1f | %s | %s |\n", r.Setting, modeLabel(r.Mode), r.Rate, vsA, vsB,
				r.MeanMS, r.P90MS, float64(down)/1e3/req, float64(up)/1e3/req, float64(r.WANBytes)/1e6, hit, orig)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func mixTitle(m string) string {
	switch m {
	case MixBrowsing:
		return "RUBiS browsing mix"
	case MixBidding:
		return "RUBiS bidding mix"
	case MixListing:
		return "Data-heavy: Listing (a category's 50 first-ending items with descriptions), a writer bidding"
	}
	return m
}

func find(runs []Run, setting, mode, m string) *Run {
	for i := range runs {
		if runs[i].Setting == setting && runs[i].Mode == mode && runs[i].Mix == m {
			return &runs[i]
		}
	}
	return nil
}
