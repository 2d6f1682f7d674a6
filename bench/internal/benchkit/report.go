package benchkit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteReport writes a benchmark's results as <dir>/<name>.{json,md,png}: the report as
// indented JSON, the markdown table, and the plot that plot draws to the path it is given.
// It returns the path without extension.
func WriteReport(dir, name string, report any, table string, plot func(path string) error) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Join(dir, name)
	js, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(base+".md", []byte(table), 0o644); err != nil {
		return "", err
	}
	if err := plot(base + ".png"); err != nil {
		return "", err
	}
	return base, nil
}

// Replot reads the JSON report at path into report and draws its plot next to it.
func Replot(path string, report any, plot func(path string) error) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, report); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return plot(strings.TrimSuffix(path, ".json") + ".png")
}
