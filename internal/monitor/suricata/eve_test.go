package suricata

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testdata/eve.json holds records Suricata 7.0.10 wrote in this package's tests: a passive
// alert, an http record, an inline alert and its drop, flow records (TCP and IPv6 ICMP)
// and pgsql records (startup, queries, an alert on a query).
func TestParseRecordedEvents(t *testing.T) {
	r := NewReader(filepath.Join("testdata", "eve.json"))
	evs, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 10 {
		t.Fatalf("read %d events, want 10", len(evs))
	}
	tcp := func(src, dst string) FiveTuple {
		return FiveTuple{Proto: "TCP", Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)}
	}

	a := evs[0]
	if a.Type != TypeAlert || a.Alert == nil || a.Alert.Action != Allowed || a.Alert.SignatureID != 1000001 ||
		a.Alert.Signature != "rampart attack to postgres" || a.Alert.Severity != 3 || a.Alert.GID != 1 || a.Alert.Rev != 1 {
		t.Errorf("passive alert: %s %+v", a, a.Alert)
	}
	if a.Tuple != tcp("198.18.10.1:54672", "198.18.10.2:5432") || a.FlowID != 1702099201779300 ||
		a.Interface != "rm9158ee" || a.Direction != "to_server" || a.AppProto != "http" {
		t.Errorf("passive alert's flow: %s iface %s dir %s app %s", a, a.Interface, a.Direction, a.AppProto)
	}
	if want := time.Date(2026, 11, 27, 22, 45, 10, 986182000, time.UTC); !a.Time.Equal(want) {
		t.Errorf("alert time %s, want %s", a.Time, want)
	}
	if a.Flow != nil || a.HTTP == nil || a.HTTP.URL != "rampart-attack" {
		t.Errorf("alert: flow summary %v (want none: only flow records have one), http %+v", a.Flow, a.HTTP)
	}

	if h := evs[1]; h.Type != TypeHTTP || h.HTTP.Method != "GET" || h.HTTP.Length != 19 || h.FlowID != a.FlowID {
		t.Errorf("http: %s %+v", h, h.HTTP)
	}
	b, d := evs[2], evs[3]
	if b.Alert.Action != Blocked || d.Type != TypeDrop || d.Drop == nil || d.Drop.Len != 71 || d.Drop.Reason != "rules" ||
		!d.Drop.ACK || d.Drop.SYN || d.FlowID != b.FlowID || d.Tuple != b.Tuple {
		t.Errorf("inline alert and drop: %s / %s %+v", b, d, d.Drop)
	}
	f := evs[4]
	if f.Type != TypeFlow || f.Flow == nil || !f.Flow.Alerted || f.Flow.State != "closed" || f.Flow.Reason != "timeout" ||
		f.Flow.PktsToServer != 6 || f.Flow.PktsToClient != 4 || f.Flow.BytesToServer != 423 || f.Flow.BytesToClient != 291 ||
		f.Tuple != a.Tuple || f.Flow.End.Before(f.Flow.Start) || f.Flow.Start.IsZero() {
		t.Errorf("flow: %s %+v", f, f.Flow)
	}
	v6 := evs[5]
	if v6.Tuple.Proto != "IPv6-ICMP" || v6.Tuple.Src.Addr() != netip.IPv6Unspecified() ||
		v6.Tuple.Dst.Addr() != netip.MustParseAddr("ff02::16") || v6.Tuple.Dst.Port() != 0 {
		t.Errorf("IPv6 ICMP flow: %s", v6)
	}
	start, create, insert, q := evs[6].PgSQL, evs[7].PgSQL, evs[8].PgSQL, evs[9]
	if start == nil || start.User != "postgres" || start.Database != "postgres" || start.SimpleQuery != "" || start.ErrorCode != "" {
		t.Errorf("pgsql startup: %+v", start)
	}
	if create.SimpleQuery != "CREATE TABLE users (id serial PRIMARY KEY, name text)" || create.CommandCompleted != "CREATE TABLE" || create.TxID != 2 {
		t.Errorf("pgsql create: %+v", create)
	}
	if insert.SimpleQuery != "INSERT INTO users (name) VALUES ('alice')" || insert.CommandCompleted != "INSERT 0 1" {
		t.Errorf("pgsql insert: %+v", insert)
	}
	if q.Type != TypeAlert || q.AppProto != "pgsql" || q.PgSQL == nil || q.PgSQL.SimpleQuery != "SELECT name FROM users" ||
		q.PgSQL.CommandCompleted != "" || q.Alert.Action != Blocked {
		t.Errorf("pgsql alert: %s", q)
	}
	if more, err := r.Next(); err != nil || len(more) != 0 {
		t.Errorf("second read: %d events, %v; want none", len(more), err)
	}
}

// The reader returns whole lines only, picks up what is appended, and reports a bad record
// without losing the good ones around it.
func TestReaderAppendAndErrors(t *testing.T) {
	rec, err := os.ReadFile(filepath.Join("testdata", "eve.json"))
	if err != nil {
		t.Fatal(err)
	}
	lines := splitLines(rec)
	path := filepath.Join(t.TempDir(), "eve.json")
	r := NewReader(path)
	if evs, err := r.Next(); err != nil || len(evs) != 0 {
		t.Fatalf("missing file: %d events, %v; want none, no error", len(evs), err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A line and half of the next.
	f.Write(append(lines[0], '\n'))
	f.Write(lines[1][:20])
	if evs, err := r.Next(); err != nil || len(evs) != 1 || evs[0].Type != TypeAlert {
		t.Fatalf("first read: %v, %v; want the alert only", evs, err)
	}
	f.Write(append(lines[1][20:], '\n'))
	f.Write([]byte("{\"event_type\":\"alert\",\"timestamp\":\"yesterday\"}\n"))
	f.Write(append(lines[2], '\n'))
	evs, err := r.Next()
	if err == nil || len(evs) != 2 || evs[0].Type != TypeHTTP || evs[1].Alert == nil || evs[1].Alert.Action != Blocked {
		t.Fatalf("second read: %v, %v; want the http record and the blocked alert, and an error for the bad record", evs, err)
	}
	t.Logf("bad record: %v", err)
	if evs, err := r.Next(); err != nil || len(evs) != 0 {
		t.Errorf("third read: %v, %v; want nothing", evs, err)
	}
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}

// A stats record (Suricata 7.0.10's, abridged: it holds every counter) gives the capture
// counters; it has no flow.
func TestParseStatsRecord(t *testing.T) {
	line := `{"timestamp":"2026-12-07T20:54:21.932352+0000","event_type":"stats","stats":{"uptime":6,"capture":{"kernel_packets":30,"kernel_drops":2,"errors":0,"afpacket":{"busy_loop_avg":0,"polls":46,"poll_signal":0,"poll_timeout":43,"poll_data":2,"poll_errors":0,"send_errors":0}},"decoder":{"pkts":30,"bytes":2805,"invalid":0,"ipv4":30},"detect":{"alert":3,"alert_queue_overflow":0,"alerts_suppressed":0}}}`
	ev, err := ParseEvent([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != TypeStats || ev.Stats == nil || *ev.Stats != (Stats{KernelPackets: 30, KernelDrops: 2}) || ev.Tuple != (FiveTuple{}) {
		t.Errorf("stats record: %s %+v", ev, ev.Stats)
	}
	alert := `{"timestamp":"2026-12-07T20:54:21.932352+0000","event_type":"alert","src_ip":"198.18.0.1","dest_ip":"198.18.0.2","proto":"TCP","stats":{"capture":{"kernel_packets":1}}}`
	if ev, err := ParseEvent([]byte(alert)); err != nil || ev.Stats != nil {
		t.Errorf("an alert record with a stats field: %v, stats %+v", err, ev.Stats)
	}
}
