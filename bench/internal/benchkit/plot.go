package benchkit

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// DrawPNG draws on a w by h canvas with drawFn and writes it as a PNG image at path.
func DrawPNG(w, h vg.Length, path string, drawFn func(dc draw.Canvas)) error {
	img := vgimg.New(w, h)
	drawFn(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	if _, err := (&vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return f.Close()
}

// PlotPNG draws p alone on a w by h PNG image at path.
func PlotPNG(p *plot.Plot, w, h vg.Length, path string) error {
	return DrawPNG(w, h, path, p.Draw)
}

// GridPNG draws rows of plots, their axes aligned (plot.Align) in tiles, on a w by h PNG
// image at path.
func GridPNG(rows [][]*plot.Plot, tiles draw.Tiles, w, h vg.Length, path string) error {
	return DrawPNG(w, h, path, func(dc draw.Canvas) {
		canvases := plot.Align(rows, tiles, dc)
		for i, row := range rows {
			for j, p := range row {
				p.Draw(canvases[i][j])
			}
		}
	})
}

// Tiles lays out rows by cols plots with the margins the benchmarks' stacked plots share
// and padX and padY between them.
func Tiles(rows, cols int, padX, padY vg.Length) draw.Tiles {
	return draw.Tiles{Rows: rows, Cols: cols, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadX: padX, PadY: padY}
}

// LogTicks labels 1-2-5 steps of each decade, which a log axis spanning few decades needs
// to be readable.
type LogTicks struct{}

// Ticks implements plot.Ticker.
func (LogTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= min && v <= max {
				out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return out
}
