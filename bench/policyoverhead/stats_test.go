package policyoverhead

import (
	"context"
	"math"
	"net"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), c.in...)
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Fatalf("median reordered its input: %v", c.in)
			}
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for p, want := range map[float64]time.Duration{50: 50, 90: 90, 99: 99, 100: 100, 0.1: 1} {
		if got := percentile(d, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("p99 of one sample = %v", got)
	}
}

func TestSummarizeRR(t *testing.T) {
	var lat []time.Duration
	for i := range 1000 {
		lat = append(lat, time.Duration(1000-i)*time.Microsecond) // unsorted on purpose
	}
	r := summarizeRR(lat, 2*time.Second)
	if r.Transactions != 1000 || r.TPS != 500 {
		t.Errorf("transactions %d, tps %v; want 1000 and 500", r.Transactions, r.TPS)
	}
	if r.P50Us != 500 || r.P90Us != 900 || r.P99Us != 990 || r.MeanUs != 500.5 {
		t.Errorf("p50 %v p90 %v p99 %v mean %v; want 500 900 990 500.5", r.P50Us, r.P90Us, r.P99Us, r.MeanUs)
	}
}

// A request/response exchange over an in-memory connection: the client counts only
// complete round trips, and the server answers with the configured response size.
func TestTransactOverPipe(t *testing.T) {
	cli, srv := net.Pipe()
	defer cli.Close()
	go serveConn(srv, 3, 5)
	r, err := transact(context.Background(), cli, 3, 5, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Transactions == 0 || r.TPS <= 0 {
		t.Fatalf("no transactions: %+v", r)
	}
	if !(r.P50Us > 0 && r.P50Us <= r.P90Us && r.P90Us <= r.P99Us) {
		t.Errorf("percentiles not ordered: %+v", r)
	}
	// A server that answers with fewer bytes than the client waits for makes the client
	// time out rather than count a transaction.
	cli2, srv2 := net.Pipe()
	defer cli2.Close()
	go serveConn(srv2, 1, 1)
	cli2.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := transact(context.Background(), cli2, 1, 2, 10*time.Millisecond); err == nil {
		t.Error("short responses counted as transactions")
	}
}

func TestParseIperf(t *testing.T) {
	ok := []byte(`{"start":{},"intervals":[],"end":{
		"sum_sent":{"seconds":3.0,"bits_per_second":1.2e10,"retransmits":7},
		"sum_received":{"seconds":3.0001,"bits_per_second":1.19e10}}}`)
	r, err := parseIperf(ok)
	if err != nil {
		t.Fatal(err)
	}
	if r.BitsPerSecond != 1.19e10 || r.SenderBps != 1.2e10 || r.Retransmits != 7 {
		t.Errorf("got %+v", r)
	}
	_, err = parseIperf([]byte(`{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}`))
	if err == nil || !iperfRetryable(err) {
		t.Errorf("refused connection: err %v, want a retryable error", err)
	}
	if _, err := parseIperf([]byte(`{"end":{}}`)); err == nil || iperfRetryable(err) {
		t.Errorf("report without a rate: err %v, want a non-retryable error", err)
	}
	if _, err := parseIperf([]byte("iperf3: error")); err == nil {
		t.Error("non-JSON output accepted")
	}
}
