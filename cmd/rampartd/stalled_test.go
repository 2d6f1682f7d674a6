package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
	"github.com/rampartnet/rampart/internal/testenv"
)

// stalledFloodFlows is how many flow events the flood makes the agent read: enough that
// queueing them for the two stalled followers, at 432 bytes per api.Flow value before
// its strings, would take over 120 MiB, well past stalledRSSBound.
const stalledFloodFlows = 150_000

// stalledRSSBound is how much the agent's RSS may grow while the stalled readers are open
// and the flood runs. Measured on a 2-core test machine: a peak 28 to 35 MiB over the 67
// to 76 MiB before the flood, nearly all of it the flow history filling up (2 x 8192
// flows: with the history full before, the peak was 2 MiB over), so the bound leaves
// more than twice that. With the followers' queues made 2^20 flows deep instead of 1024,
// RSS grew by 288 MiB in a flood of 50,000 flow events.
const stalledRSSBound = 80 << 20

// TestStalledReadersKeepMemoryBounded is issue 27's "the agent's memory stays bounded with
// a slow or absent reader" on a real rampartd: a Hubble GetFlows follower and a `rampart
// observe --follow` on the API socket that never read after their first flow, and the
// service map (--ui-address), which follows every flow, are open while a flood of denied
// datagrams makes the agent read many flow events. The agent's RSS must stay within
// stalledRSSBound of what it was before, the stalled followers must lose flows
// (rampart_observe_flows_lost_total) instead of queueing them, `rampart status` must
// answer within 2 s meanwhile, and once the stalled readers are gone new ones get flows.
func TestStalledReadersKeepMemoryBounded(t *testing.T) {
	testenv.RequireRoot(t)
	bin := bins.Dir(t)
	sockDir, flags := instanceFlags(t, "sr", "198.19.93.0/24")
	hubbleSock := filepath.Join(sockDir, "hubble.sock")
	daemon, log := startDaemon(t, bin, flags, "--hubble-address", "unix://"+hubbleSock,
		"--metrics-address", "127.0.0.1:0", "--ui-address", "127.0.0.1:0")
	addrs := awaitServing(t, bin, sockDir, log, "serving metrics", "serving the service map")
	metricsAddr, uiAddr := addrs[0], addrs[1]
	must := mustCLI(t, bin, sockDir, log)
	must("endpoint", "add", "x/a", "--labels", "pod=a")
	must("endpoint", "add", "y/b", "--labels", "pod=b", "--ip", "198.19.93.50")
	must("apply", "-f", defaultDenyFile(t, "y"))

	client := api.NewClient(filepath.Join(sockDir, "r.sock"))
	defer client.Close()
	status := func() api.Status {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := client.Status(ctx)
		if err != nil {
			t.Fatalf("status within 2s: %v\nagent log:\n%s", err, log.String())
		}
		return st
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := client.GetEndpoint(ctx, "x", "a")
	if err != nil {
		t.Fatal(err)
	}
	// One unconnected socket in x/a sends every datagram, each to another port of y/b: a
	// new flow leaving x/a and a drop (default deny) entering y/b, two flow events each.
	var sender *net.UDPConn
	if err := testenv.InNetns(a.Netns, func() (err error) {
		sender, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	payload := []byte("stalled")
	port := uint16(1024)
	send := func(n int) {
		t.Helper()
		for range n {
			if _, err := sender.WriteToUDPAddrPort(payload, netip.AddrPortFrom(netip.MustParseAddr("198.19.93.50"), port)); err != nil {
				t.Fatalf("sending from x/a: %v", err)
			}
			if port++; port == 0 {
				port = 1024
			}
		}
	}
	// A flow in the history first: each follower's first message then says it follows.
	send(1)
	if !testenv.Eventually(5*time.Second, func() bool { return status().FlowsSeen >= 1 }) {
		t.Fatalf("no flow of the first datagram; agent log:\n%s", log.String())
	}

	// (a) Hubble: the connection's and the stream's windows are fixed at 64 KiB (no
	// BDP-driven growth), so once the unread stream holds that much the server's sends stall.
	hubbleConn := func(opts ...grpc.DialOption) observerpb.ObserverClient {
		t.Helper()
		conn, err := grpc.NewClient("unix://"+hubbleSock, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return observerpb.NewObserverClient(conn)
	}
	hctx, hcancel := context.WithCancel(context.Background())
	defer hcancel()
	stalledHubble, err := hubbleConn(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).
		GetFlows(hctx, &observerpb.GetFlowsRequest{Number: 1, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stalledHubble.Recv(); err != nil {
		t.Fatalf("hubble follower's first flow: %v", err)
	}
	// (b) rampart observe --follow, as a raw request on the API socket whose body is not
	// read past its first line.
	stalledAPI, err := net.Dial("unix", filepath.Join(sockDir, "r.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer stalledAPI.Close()
	body := `{"follow":true,"last":1}`
	fmt.Fprintf(stalledAPI, "POST /v1/observe HTTP/1.1\r\nHost: rampart\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(stalledAPI), nil)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("observe follower: %s, first line %q (%v)", resp.Status, line, err)
	}

	pid := daemon.Process.Pid
	// VmHWM, reset to the current RSS here, is the peak RSS from now on: a spike between
	// two polls is not missed.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	before := status()
	rssBefore := procStatus(t, pid, "VmRSS")[0]
	start := time.Now()
	var st api.Status
	// The kernel's event ring loses what the reader has not taken when it is full, so the
	// flood goes on until the agent has read enough; each status must come within 2 s.
	if !testenv.Eventually(40*time.Second, func() bool {
		send(2000)
		st = status()
		return st.FlowsSeen-before.FlowsSeen >= stalledFloodFlows
	}) {
		t.Fatalf("the agent read %d flow events in 40s, want %d", st.FlowsSeen-before.FlowsSeen, stalledFloodFlows)
	}
	flood := time.Since(start)

	// The stalled followers lost what their queues could not hold.
	var lost float64
	if !testenv.Eventually(5*time.Second, func() bool {
		lost = scrapeMetrics(t, metricsAddr).value(t, "rampart_observe_flows_lost_total")
		return lost > 0
	}) {
		t.Errorf("rampart_observe_flows_lost_total still 0 after %d flows with two stalled followers", st.FlowsSeen-before.FlowsSeen)
	}
	began := time.Now()
	if out, errs, code := run(bin, sockDir, "status"); code != 0 || time.Since(began) > 2*time.Second {
		t.Errorf("rampart status with stalled followers: exit %d after %v: %s %s", code, time.Since(began), out, errs)
	}
	mem := procStatus(t, pid, "VmRSS", "VmHWM")
	t.Logf("%d flow events in %v (%d lost by the followers); RSS %d MiB before, %d MiB after, peak %d MiB",
		st.FlowsSeen-before.FlowsSeen, flood.Round(time.Millisecond), uint64(lost), rssBefore>>20, mem[0]>>20, mem[1]>>20)
	if mem[1] > rssBefore+stalledRSSBound {
		t.Errorf("RSS peaked at %d MiB with stalled followers, %d MiB before the flood: want at most %d MiB more",
			mem[1]>>20, rssBefore>>20, stalledRSSBound>>20)
	}

	// The stalled readers go; new ones get flows from the history.
	hcancel()
	stalledAPI.Close()
	if out := must("observe", "--last", "5", "-o", "json"); strings.Count(out, "\n") != 5 {
		t.Errorf("rampart observe --last 5 after the stall:\n%s", out)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	fresh, err := hubbleConn().GetFlows(fctx, &observerpb.GetFlowsRequest{Number: 5})
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for {
		r, err := fresh.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("hubble GetFlows after the stall: %v", err)
		}
		if r.GetFlow() != nil {
			got++
		}
	}
	if got != 5 {
		t.Errorf("hubble GetFlows number 5 after the stall: %d flows", got)
	}
	uiResp, err := http.Get("http://" + uiAddr + "/api/map")
	if err != nil {
		t.Fatal(err)
	}
	uiResp.Body.Close()
	if uiResp.StatusCode != http.StatusOK {
		t.Errorf("service map after the flood: %s", uiResp.Status)
	}
}
