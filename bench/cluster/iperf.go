package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Traffic is one kind of iperf3 test: TCP, or UDP with datagrams of a given size.
type Traffic struct {
	Name string `json:"name"` // tcp, udp-1400, udp-8000
	UDP  bool   `json:"udp"`
	// Len is the UDP datagram payload in bytes (iperf3 -l); 0 for TCP.
	Len int `json:"len,omitempty"`
}

// ParseTraffic reads "tcp" or "udp-N".
func ParseTraffic(s string) (Traffic, error) {
	if s == "tcp" {
		return Traffic{Name: s}, nil
	}
	if n, ok := strings.CutPrefix(s, "udp-"); ok {
		l, err := strconv.Atoi(n)
		// 65507: the largest UDP payload over IPv4.
		if err != nil || l < 16 || l > 65507 {
			return Traffic{}, fmt.Errorf("traffic %q: want udp-N with 16 <= N <= 65507", s)
		}
		return Traffic{Name: s, UDP: true, Len: l}, nil
	}
	return Traffic{}, fmt.Errorf("traffic %q: want tcp or udp-N", s)
}

// Fragments says whether the traffic's datagrams are larger than a pod interface of mtu
// carries in one packet (IPv4 and UDP headers, 28 bytes, included).
func (t Traffic) Fragments(mtu int) bool { return t.UDP && t.Len+28 > mtu }

// Flow is what the benchmark keeps of one iperf3 client run.
type Flow struct {
	// Bps is the receiver's rate: what crossed both nodes' policy points.
	Bps         float64 `json:"bits_per_second"`
	SenderBps   float64 `json:"sender_bits_per_second"`
	Seconds     float64 `json:"seconds"`
	Retransmits int64   `json:"retransmits,omitempty"`  // TCP
	Packets     int64   `json:"packets,omitempty"`      // UDP datagrams sent
	LostPackets int64   `json:"lost_packets,omitempty"` // UDP datagrams the receiver missed
}

type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   int64   `json:"retransmits"`
	Packets       int64   `json:"packets"`
	LostPackets   int64   `json:"lost_packets"`
}

// iperfJSON is the part of `iperf3 -J` (3.12) output the benchmark reads.
type iperfJSON struct {
	Error string `json:"error"`
	End   struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
	} `json:"end"`
}

// parseIperf reads iperf3's JSON report; a failure reported inside it is an error.
func parseIperf(out []byte, udp bool) (Flow, error) {
	var j iperfJSON
	if err := json.Unmarshal(out, &j); err != nil {
		return Flow{}, fmt.Errorf("parsing iperf3 JSON: %w (output %q)", err, benchkit.Truncate(string(out), 200))
	}
	if j.Error != "" {
		return Flow{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	r, s := j.End.SumReceived, j.End.SumSent
	f := Flow{Bps: r.BitsPerSecond, SenderBps: s.BitsPerSecond, Seconds: r.Seconds}
	if udp {
		// The receiver's count: iperf3 3.12 puts the server's loss in sum_received.
		f.Packets, f.LostPackets = r.Packets, r.LostPackets
	} else {
		f.Retransmits = s.Retransmits
	}
	if f.Seconds <= 0 || (f.Bps <= 0 && !udp) {
		return Flow{}, fmt.Errorf("iperf3 report without a received rate")
	}
	return f, nil
}

// iperfRetryable says whether an iperf3 failure means "server not reachable yet" (still
// starting, a policy still being applied, the previous test still closing) rather than a
// broken run.
func iperfRetryable(err error) bool {
	s := err.Error()
	return strings.Contains(s, "unable to connect") || strings.Contains(s, "Connection refused") ||
		strings.Contains(s, "the server is busy")
}

// iperfArgs is the client's command line. A UDP client sends udpBps bits/s, or with 0
// as fast as it can (every sender offers what its CPU allows, and the receivers' rate and
// loss show what the path carried).
func iperfArgs(iperf3 string, server *Pod, port int, t Traffic, seconds int, udpBps float64) []string {
	args := []string{iperf3, "-c", server.IP.String(), "-p", strconv.Itoa(port), "-t", strconv.Itoa(seconds), "-J"}
	if t.UDP {
		args = append(args, "-u", "-b", strconv.FormatInt(int64(udpBps), 10), "-l", strconv.Itoa(t.Len))
	}
	return args
}

// runIperf runs one iperf3 client in client, retrying while the server is not reachable
// yet (up to connectTimeout).
func runIperf(ctx context.Context, argv []string, client *Pod, udp bool, seconds int) (Flow, error) {
	deadline := time.Now().Add(connectTimeout)
	for {
		out, runErr := benchkit.RunOutput(ctx, time.Duration(seconds)*time.Second+time.Minute, func(ctx context.Context) *exec.Cmd {
			return client.Command(ctx, argv...)
		})
		f, err := parseIperf(out, udp)
		if err == nil {
			return f, nil
		}
		if runErr != nil && len(out) == 0 {
			err = runErr
		}
		if !iperfRetryable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return Flow{}, fmt.Errorf("iperf3 from %s: %w", client.Name, err)
		}
		select {
		case <-ctx.Done():
			return Flow{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
