package report

import (
	"fmt"
	"image/color"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot writes throughput.png (requests/s against clients, a line per
// mode) and latency.png (worst interaction p90 against clients) into dir:
// the medians over the repeats.
func (r *Report) Plot(dir string) error {
	for _, p := range []struct {
		file, title, y string
		value          func(Spread) float64
	}{
		{"throughput.png", "RUBiS " + r.Mix + ": throughput", "requests/s", func(x Spread) float64 { return x.Median }},
		{"latency.png", "RUBiS " + r.Mix + ": worst interaction p90", "ms", func(x Spread) float64 { return x.WorstP90 }},
	} {
		pl := plot.New()
		pl.Title.Text, pl.X.Label.Text, pl.Y.Label.Text = p.title, "clients (k6 VUs)", p.y
		byMode := map[string]plotter.XYs{}
		var modes []string
		for _, x := range Spreads(r.Runs) {
			if _, ok := byMode[x.Mode]; !ok {
				modes = append(modes, x.Mode)
			}
			byMode[x.Mode] = append(byMode[x.Mode], plotter.XY{X: float64(x.VUs), Y: p.value(x)})
		}
		palette := []color.Color{color.RGBA{31, 119, 180, 255}, color.RGBA{214, 39, 40, 255}, color.RGBA{44, 160, 44, 255}, color.RGBA{148, 103, 189, 255}}
		for i, m := range modes {
			pts := byMode[m]
			sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = palette[i%len(palette)], palette[i%len(palette)]
			pl.Add(line, points)
			pl.Legend.Add(m, line, points)
		}
		pl.Legend.Top = true
		if err := pl.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, p.file)); err != nil {
			return fmt.Errorf("report: plot: %w", err)
		}
	}
	return nil
}
