package policyoverhead

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// IperfResult is what the benchmark keeps of one iperf3 client run.
type IperfResult struct {
	// BitsPerSecond is the receiver's rate: what actually crossed both policy points.
	BitsPerSecond float64 `json:"bits_per_second"`
	SenderBps     float64 `json:"sender_bits_per_second"`
	Retransmits   int64   `json:"retransmits"`
	Seconds       float64 `json:"seconds"`
}

// iperfJSON is the part of `iperf3 -J` output the benchmark reads.
type iperfJSON struct {
	Error string `json:"error"`
	End   struct {
		SumSent struct {
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
			Retransmits   int64   `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
}

// ParseIperf reads iperf3's JSON report (`iperf3 -J`), for the benchmarks that run
// iperf3 too.
func ParseIperf(out []byte) (IperfResult, error) { return parseIperf(out) }

// IperfRetryable says whether an iperf3 failure means the server is not reachable yet.
func IperfRetryable(err error) bool { return iperfRetryable(err) }

// parseIperf reads iperf3's JSON report. iperf3 reports failures inside the JSON (with a
// non-zero exit), so an "error" field is returned as an error.
func parseIperf(out []byte) (IperfResult, error) {
	var j iperfJSON
	if err := json.Unmarshal(out, &j); err != nil {
		return IperfResult{}, fmt.Errorf("parsing iperf3 JSON: %w (output %q)", err, benchkit.Truncate(string(out), 200))
	}
	if j.Error != "" {
		return IperfResult{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	r := IperfResult{
		BitsPerSecond: j.End.SumReceived.BitsPerSecond,
		SenderBps:     j.End.SumSent.BitsPerSecond,
		Retransmits:   j.End.SumSent.Retransmits,
		Seconds:       j.End.SumReceived.Seconds,
	}
	if r.BitsPerSecond <= 0 || r.Seconds <= 0 {
		return IperfResult{}, fmt.Errorf("iperf3 report without a received rate")
	}
	return r, nil
}

// iperfRetryable says whether an iperf3 failure means "server not reachable yet" (it is
// still starting, or a policy is still being applied) rather than a broken run.
func iperfRetryable(err error) bool {
	s := err.Error()
	return strings.Contains(s, "unable to connect") || strings.Contains(s, "Connection refused") ||
		strings.Contains(s, "the server is busy")
}
