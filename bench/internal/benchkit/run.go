package benchkit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// What the benchmarks' runs share: recording set-up failures and clean-up errors in the
// report, and writing the report and its plot as the run goes and at its end.

// FailFunc returns the fail step of a run whose report is res: it records a set-up error
// in the report's errors and returns res with the error.
func FailFunc[R any](res R, errs *[]string) func(error) (R, error) {
	return func(e error) (R, error) {
		*errs = append(*errs, e.Error())
		return res, e
	}
}

// CleanupErrors are errs as a report lists them, each marked as the clean-up's.
func CleanupErrors(errs []error) []string {
	var out []string
	for _, err := range errs {
		out = append(out, "clean-up: "+err.Error())
	}
	return out
}

// BPFStatsOff turns the kernel's BPF run-time statistics off for the run (the package
// function BPFStatsOff), undoing it with the run's other steps, and returns what it found.
func (c *Cleanups) BPFStatsOff() (string, error) {
	state, restore, err := BPFStatsOff()
	if err != nil {
		return "", err
	}
	c.Add(restore)
	return state, nil
}

// Stamped is a run's output file name stem: name and the run's start in UTC.
func Stamped(name string, started time.Time) string {
	return name + "-" + started.UTC().Format("20060102T150405Z")
}

// WriteJSON writes v as indented JSON to path, creating its directory; the file is
// replaced whole, so a report rewritten as a run grows is never read half written.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating results directory: %w", err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding results: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	return nil
}

// PlotNextTo draws a report's plot with plot as a PNG next to its JSON report at jsonPath
// and returns the plot's path, or "" with noPlot.
func PlotNextTo(jsonPath string, noPlot bool, plot func(path string) error) (string, error) {
	if noPlot {
		return "", nil
	}
	p := strings.TrimSuffix(jsonPath, ".json") + ".png"
	if err := plot(p); err != nil {
		return "", fmt.Errorf("plotting: %w", err)
	}
	return p, nil
}
