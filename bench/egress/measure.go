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

// Ping is one `ping -i 0.001` run, or several pooled: round-trip times of the answered
// requests.
type Ping struct {
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	MeanUs   float64 `json:"mean_us"`
	// P50Us is the median as grouped data: ping prints round trips under 1 ms to whole
	// microseconds, which at 15-20 us would make medians whole numbers and their ratios
	// jump in steps of about 6 %. Each printed value stands for the interval it was
	// rounded from, and the median is interpolated inside the interval holding it.
	P50Us float64 `json:"p50_us"`
	P90Us float64 `json:"p90_us"`
	P99Us float64 `json:"p99_us"`
	MaxUs float64 `json:"max_us"`

	rtts []time.Duration // sorted; kept to pool the blocks of a pair
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
	return pingStats(r.Sent, r.Received, rtts), nil
}

// pingStats summarises sorted round trips.
func pingStats(sent, received int, rtts []time.Duration) Ping {
	r := Ping{Sent: sent, Received: received, rtts: rtts}
	if len(rtts) == 0 {
		return r
	}
	var sum time.Duration
	for _, d := range rtts {
		sum += d
	}
	us := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)*10) / 10 }
	r.MeanUs = us(sum / time.Duration(len(rtts)))
	r.P50Us = math.Round(groupedMedian(rtts)/float64(time.Microsecond)*100) / 100
	r.P90Us = us(benchkit.Percentile(rtts, 90))
	r.P99Us = us(benchkit.Percentile(rtts, 99))
	r.MaxUs = us(rtts[len(rtts)-1])
	return r
}

// pingResolution is the step in which iputils ping prints a round trip of about d (three
// decimals of a millisecond under 1 ms, two under 10 ms, one under 100 ms).
func pingResolution(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return time.Microsecond
	case d < 10*time.Millisecond:
		return 10 * time.Microsecond
	case d < 100*time.Millisecond:
		return 100 * time.Microsecond
	}
	return time.Millisecond
}

// groupedMedian is the median of sorted values printed in steps (pingResolution), in
// nanoseconds: the values equal to the middle one are spread evenly over the step they
// were rounded from, and the median is where half of all values lie below.
func groupedMedian(sorted []time.Duration) float64 {
	n := len(sorted)
	v := benchkit.Percentile(sorted, 50)
	below, _ := slices.BinarySearch(sorted, v)
	equal := 0
	for _, d := range sorted[below:] {
		if d != v {
			break
		}
		equal++
	}
	w := float64(pingResolution(v))
	return float64(v) - w/2 + (float64(n)/2-float64(below))/float64(equal)*w
}

// combinePing pools the blocks of one side of a pair.
func combinePing(blocks []Ping) Ping {
	var sent, received int
	var rtts []time.Duration
	for _, b := range blocks {
		sent += b.Sent
		received += b.Received
		rtts = append(rtts, b.rtts...)
	}
	slices.Sort(rtts)
	return pingStats(sent, received, rtts)
}

// combineIperf merges the blocks of one side of a pair: rates and CPU shares weighted by
// each block's duration, retransmits summed.
func combineIperf(blocks []Iperf) Iperf {
	if len(blocks) == 1 {
		return blocks[0]
	}
	var out Iperf
	var secs float64
	for _, b := range blocks {
		w := b.Seconds
		secs += w
		out.BitsPerSecond += b.BitsPerSecond * w
		out.SenderBps += b.SenderBps * w
		out.LostPercent += b.LostPercent * w
		out.HostCPU += b.HostCPU * w
		out.RemoteCPU += b.RemoteCPU * w
		out.Retransmits += b.Retransmits
		for i, c := range b.CPUBusy {
			if i >= len(out.CPUBusy) {
				out.CPUBusy = append(out.CPUBusy, 0)
			}
			out.CPUBusy[i] += c * w
		}
	}
	if secs <= 0 {
		return blocks[0]
	}
	out.Seconds = secs
	out.BitsPerSecond /= secs
	out.SenderBps /= secs
	out.LostPercent /= secs
	out.HostCPU /= secs
	out.RemoteCPU /= secs
	for i := range out.CPUBusy {
		out.CPUBusy[i] = math.Round(out.CPUBusy[i]/secs*10) / 10
	}
	return out
}

// combineRR merges request/response blocks: counts summed, the mean weighted by
// transactions, each percentile the median of the blocks' (the client reports no samples).
func combineRR(blocks []benchkit.RRResult) benchkit.RRResult {
	if len(blocks) == 1 {
		return blocks[0]
	}
	var out benchkit.RRResult
	var p50, p90, p99 []float64
	for _, b := range blocks {
		out.Transactions += b.Transactions
		out.Seconds += b.Seconds
		out.MeanUs += b.MeanUs * float64(b.Transactions)
		p50, p90, p99 = append(p50, b.P50Us), append(p90, b.P90Us), append(p99, b.P99Us)
	}
	if out.Transactions > 0 {
		out.MeanUs /= float64(out.Transactions)
	}
	if out.Seconds > 0 {
		out.TPS = float64(out.Transactions) / out.Seconds
	}
	out.P50Us, out.P90Us, out.P99Us = benchkit.Median(p50), benchkit.Median(p90), benchkit.Median(p99)
	return out
}
