package churn

import (
	"fmt"
	"os"

	"gonum.org/v1/plot/vg/vgimg"
)

func writePNG(c *vgimg.PngCanvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return f.Close()
}
