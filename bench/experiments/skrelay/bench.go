package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sample is one closed-loop fortio run on one path.
type sample struct {
	Round    int     `json:"round"`
	Path     string  `json:"path"`
	Rate     float64 `json:"requests_per_second"`
	Requests int     `json:"requests"`
	OK       int     `json:"ok"`
	// CPU time per request on each CPU (µs; from /proc/stat, all processes).
	CPUus []float64 `json:"cpu_us_per_request"`
	// Verdicts the skmsg path's program gave (allowed): proof that it ran.
	Verdicts uint64 `json:"verdicts,omitempty"`
}

func benchMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	rounds := fs.Int("rounds", 3, "rounds; each runs every path once, in turn")
	seconds := fs.Int("seconds", 5, "fortio run length")
	paths := fs.String("paths", "direct,user,splice,sockmap,skmsg,skmsg-parse", "paths to measure")
	fortio := fs.String("fortio", "fortio", "fortio binary")
	objDir := fs.String("bpf", "", "directory with relay.bpf.o and msg.bpf.o")
	conns := fs.Int("connections", 16, "fortio -c")
	out := fs.String("out", "bench/results", "output directory")
	filler := fs.Int("header-bytes", 0, "add a header of about this many bytes to each request (realistic heads are 400-800 bytes; fortio's own are about 100)")
	fs.Parse(args)
	var extra []string
	if *filler > 0 {
		extra = []string{"-H", "X-Filler: " + strings.Repeat("f", max(1, *filler-12))}
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Loopback, on ports the kernel picks, so that runs can go side by side.
	srv, err := start(self, "server", "--listen", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("starting the server: %w", err)
	}
	defer srv.kill()
	if err := waitHTTP("http://" + srv.addr + "/v1"); err != nil {
		return err
	}
	var samples []sample
	for r := 1; r <= *rounds; r++ {
		for _, p := range strings.Split(*paths, ",") {
			s, err := measure(p, self, *objDir, *fortio, *conns, *seconds, srv.addr, extra)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r, p, err)
			}
			s.Round = r
			fmt.Printf("round %d %-8s %6.0f req/s  CPU µs/request: CPU 0 %.1f, CPU 1 %.1f\n", r, p, s.Rate, s.CPUus[0], s.CPUus[1])
			samples = append(samples, s)
		}
	}
	return report(samples, strings.Split(*paths, ","), *out, *filler)
}

// measure runs fortio on path p once, with the path's relay (or verdict) in place.
func measure(p, self, objDir, fortio string, conns, seconds int, serverAddr string, fortioArgs []string) (sample, error) {
	s := sample{Path: p}
	target := "http://" + serverAddr + "/v1"
	var relay *proc
	if p != "direct" {
		mode, program, _ := strings.Cut(p, "-")
		obj := map[string]string{"sockmap": "relay.bpf.o", "skmsg": "msg.bpf.o"}[mode]
		args := []string{"relay", "--mode", mode, "--upstream", serverAddr, "--obj", filepath.Join(objDir, obj)}
		if program == "parse" {
			args = append(args, "--program", "request_parsed")
		}
		var err error
		if relay, err = start(self, args...); err != nil {
			return s, fmt.Errorf("starting the relay: %w", err)
		}
		defer relay.kill()
		target = "http://" + relay.addr + "/v1"
		if err := waitHTTP(target); err != nil {
			return s, err
		}
	}
	before, err := cpuBusy()
	if err != nil {
		return s, err
	}
	args := append([]string{"-c", "0", fortio, "load", "-qps", "0", "-c", strconv.Itoa(conns),
		"-t", fmt.Sprintf("%ds", seconds), "-json", "-"}, fortioArgs...)
	cmd := exec.Command("taskset", append(args, target)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		e := stderr.String()
		return s, fmt.Errorf("fortio: %w: %s", err, e[max(0, len(e)-500):])
	}
	after, err := cpuBusy()
	if err != nil {
		return s, err
	}
	var f struct {
		ActualQPS float64
		RetCodes  map[string]int
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return s, fmt.Errorf("reading fortio's report: %w", err)
	}
	s.Rate = f.ActualQPS
	for code, n := range f.RetCodes {
		s.Requests += n
		if code == "200" {
			s.OK += n
		}
	}
	if s.Requests == 0 || s.OK != s.Requests {
		return s, fmt.Errorf("%d of %d requests answered 200", s.OK, s.Requests)
	}
	for cpu := range before {
		s.CPUus = append(s.CPUus, float64(after[cpu]-before[cpu])*1e6/100/float64(s.Requests))
	}
	if strings.HasPrefix(p, "skmsg") {
		relay.cmd.Process.Signal(syscall.SIGTERM)
		line, _ := relay.out.ReadString('\n')
		var other uint64
		if _, err := fmt.Sscanf(line, "sends seen: %d allowed, %d other", &s.Verdicts, &other); err != nil || s.Verdicts < uint64(s.Requests) {
			return s, fmt.Errorf("the verdict program saw too few requests: %q", line)
		}
	}
	return s, nil
}

// proc is a helper process of the experiment (server or relay) that said it was ready.
type proc struct {
	cmd  *exec.Cmd
	out  *bufio.Reader // its standard output after the "ready" line
	addr string        // the address in its "ready ADDRESS" line
}

// start runs `self args...` on CPU 1 and waits for its "ready ADDRESS" line.
func start(self string, args ...string) (*proc, error) {
	cmd := exec.Command("taskset", append([]string{"-c", "1", self}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, out: bufio.NewReader(stdout)}
	line, err := p.out.ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		p.kill()
		return nil, fmt.Errorf("%s did not start: %q %v", args[0], line, err)
	}
	p.addr = addr
	return p, nil
}

func (p *proc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// cpuBusy reads the busy time of CPU 0 and CPU 1 in USER_HZ ticks (1/100 s).
func cpuBusy() ([]uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	busy := make([]uint64, 2)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || (f[0] != "cpu0" && f[0] != "cpu1") {
			continue
		}
		var t uint64
		for i, v := range f[1:9] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			n, _ := strconv.ParseUint(v, 10, 64)
			t += n
		}
		busy[f[0][3]-'0'] = t
	}
	return busy, nil
}

func waitHTTP(url string) error {
	c := http.Client{Timeout: 500 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if r, err := c.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer 200 within 10 s", url)
}

func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// report prints and writes (JSON and markdown) the medians per path and the ratio of
// each path's rate to direct's in the same round.
func report(samples []sample, paths []string, out string, headerBytes int) error {
	direct := map[int]float64{}
	for _, s := range samples {
		if s.Path == "direct" {
			direct[s.Round] = s.Rate
		}
	}
	var md strings.Builder
	md.WriteString("| path | req/s (median, min-max) | vs direct (median of rounds) | CPU 0 µs/req | CPU 1 µs/req | total µs/req |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range paths {
		var rate, ratio, c0, c1 []float64
		for _, s := range samples {
			if s.Path != p {
				continue
			}
			rate = append(rate, s.Rate)
			if d := direct[s.Round]; d > 0 {
				ratio = append(ratio, s.Rate/d)
			}
			c0, c1 = append(c0, s.CPUus[0]), append(c1, s.CPUus[1])
		}
		r := "n/a"
		if len(ratio) > 0 {
			r = fmt.Sprintf("%.2f", median(ratio))
		}
		fmt.Fprintf(&md, "| %s | %.0f (%.0f-%.0f) | %s | %.1f | %.1f | %.1f |\n", p, median(rate), slices.Min(rate), slices.Max(rate),
			r, median(c0), median(c1), median(c0)+median(c1))
	}
	fmt.Print("\n" + md.String())
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	base := filepath.Join(out, "skrelay-"+time.Now().UTC().Format("20060102T150405Z"))
	j, _ := json.MarshalIndent(map[string]any{"schema": "rampart.experiment.skrelay/v1", "header_bytes": headerBytes, "samples": samples}, "", "  ")
	if err := os.WriteFile(base+".json", j, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(base+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Printf("results: %s.{json,md}\n", base)
	return nil
}
