package policyoverhead

import "testing"

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
