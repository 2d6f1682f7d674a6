package benchkit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// What the benchmarks' runs share: recording set-up failures and clean-up errors in the
// report, and writing the report and its plot as the run goes and at its end.

// RunInfo is when and where a run ran and the machine's load around it, at the head of a
// report (embedded, its fields are the report's own in JSON).
type RunInfo struct {
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Kernel    string    `json:"kernel"`
	CPUs      int       `json:"cpus"`
	LoadStart float64   `json:"load_start"`
	LoadEnd   float64   `json:"load_end"`
}

// Machine is the machine a run measured, at the head of a report's host information
// (embedded, its fields are the host information's own in JSON).
type Machine struct {
	Hostname string `json:"hostname"`
	Kernel   string `json:"kernel"`
	CPUs     int    `json:"cpus"`
	Go       string `json:"go"`
}

// ThisMachine describes the machine the run is on.
func ThisMachine() Machine {
	m := Machine{Kernel: Kernel(), CPUs: runtime.NumCPU(), Go: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	return m
}

// StartRun records a run's start: the time, the machine and its load average.
func StartRun() RunInfo {
	return RunInfo{Started: time.Now().UTC(), Kernel: Kernel(), CPUs: runtime.NumCPU(), LoadStart: LoadAverage()}
}

// Finish records the run's end and the load average then.
func (r *RunInfo) Finish() {
	r.Finished = time.Now().UTC()
	r.LoadEnd = LoadAverage()
}

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

// ReportWriter is a run's result that writes its JSON report and its markdown table into a
// directory, returning their paths.
type ReportWriter interface {
	WriteJSON(dir string) (string, error)
	WriteTable(dir string) (string, error)
}

// WriteOutputs writes res's JSON report and markdown table into dir and, unless noPlot, its
// plot with plot next to them; it returns the plot's path.
func WriteOutputs(res ReportWriter, dir string, noPlot bool, plot func(path string) error) (string, error) {
	p, err := res.WriteJSON(dir)
	if err != nil {
		return "", err
	}
	if _, err := res.WriteTable(dir); err != nil {
		return "", err
	}
	return PlotNextTo(p, noPlot, plot)
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
