package benchkit

import (
	"context"
	"net"
	"testing"
	"time"
)

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
