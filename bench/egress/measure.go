package egress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Iperf is what the benchmark keeps of one iperf3 client run.
type Iperf struct {
	// BitsPerSecond is the receiver's rate (what reached the server), SenderBps the
	// sender's.
	BitsPerSecond float64 `json:"bits_per_second"`
	SenderBps     float64 `json:"sender_bits_per_second"`
	Retransmits   int64   `json:"retransmits,omitempty"` // TCP
	LostPercent   float64 `json:"lost_percent,omitempty"`
	Seconds       float64 `json:"seconds"`
	// iperf3's own CPU accounting of the client (host) and server (remote) processes,
	// user plus system time over wall time, in percent: the original benchmark's CPU
	// metric. It misses work done in softirq context outside the processes.
	HostCPU   float64 `json:"host_cpu_percent"`
	RemoteCPU float64 `json:"remote_cpu_percent"`
	// CPUBusy is each CPU's busy share from /proc/stat over the run, in percent (indexed by
	// CPU number): everything the machine did, softirq included.
	CPUBusy []float64 `json:"cpu_busy_percent"`
}

type iperfJSON struct {
	Error string `json:"error"`
	End   struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
		CPU         struct {
			HostTotal   float64 `json:"host_total"`
			RemoteTotal float64 `json:"remote_total"`
		} `json:"cpu_utilization_percent"`
	} `json:"end"`
}

type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   int64   `json:"retransmits"`
	LostPercent   float64 `json:"lost_percent"`
}

// parseIperf reads iperf3's JSON report (TCP or UDP; iperf3 3.12 and later report
// sum_sent and sum_received for both). Failures are reported inside the JSON.
func parseIperf(out []byte) (Iperf, error) {
	var j iperfJSON
	if err := json.Unmarshal(out, &j); err != nil {
		return Iperf{}, fmt.Errorf("parsing iperf3 JSON: %w (output %q)", err, benchkit.Truncate(string(out), 200))
	}
	if j.Error != "" {
		return Iperf{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	r := Iperf{
		BitsPerSecond: j.End.SumReceived.BitsPerSecond,
		SenderBps:     j.End.SumSent.BitsPerSecond,
		Retransmits:   j.End.SumSent.Retransmits,
		LostPercent:   j.End.SumReceived.LostPercent,
		Seconds:       j.End.SumReceived.Seconds,
		HostCPU:       j.End.CPU.HostTotal,
		RemoteCPU:     j.End.CPU.RemoteTotal,
	}
	if j.End.SumSent.Seconds <= 0 || r.SenderBps <= 0 {
		return Iperf{}, fmt.Errorf("iperf3 report without a sent rate")
	}
	return r, nil
}

// Ping is one `ping -i 0.001` run: round-trip times of the answered requests.
type Ping struct {
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	MeanUs   float64 `json:"mean_us"`
	P50Us    float64 `json:"p50_us"`
	P90Us    float64 `json:"p90_us"`
	P99Us    float64 `json:"p99_us"`
	MaxUs    float64 `json:"max_us"`
}

var (
	pingTime    = regexp.MustCompile(`icmp_seq=\d+ .*time=([0-9.]+) ms`)
	pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
)

// parsePing reads iputils ping output: one "time=X ms" line per reply and the summary.
func parsePing(out []byte) (Ping, error) {
	var r Ping
	var rtts []time.Duration
	sc := bufio.NewScanner(bytes.NewReader(out))
	haveSummary := false
	for sc.Scan() {
		line := sc.Bytes()
		if m := pingTime.FindSubmatch(line); m != nil {
			ms, err := strconv.ParseFloat(string(m[1]), 64)
			if err != nil {
				return r, fmt.Errorf("ping time %q: %w", m[1], err)
			}
			rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
			continue
		}
		if m := pingSummary.FindSubmatch(line); m != nil {
			r.Sent, _ = strconv.Atoi(string(m[1]))
			r.Received, _ = strconv.Atoi(string(m[2]))
			haveSummary = true
		}
	}
	if !haveSummary {
		return r, fmt.Errorf("no ping summary in %q", benchkit.Truncate(string(out), 200))
	}
	if len(rtts) == 0 {
		return r, fmt.Errorf("no ping replies (%d sent)", r.Sent)
	}
	slices.Sort(rtts)
	var sum time.Duration
	for _, d := range rtts {
		sum += d
	}
	us := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)*10) / 10 }
	r.MeanUs = us(sum / time.Duration(len(rtts)))
	r.P50Us = us(benchkit.Percentile(rtts, 50))
	r.P90Us = us(benchkit.Percentile(rtts, 90))
	r.P99Us = us(benchkit.Percentile(rtts, 99))
	r.MaxUs = us(rtts[len(rtts)-1])
	return r, nil
}
