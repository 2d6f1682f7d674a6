package taps

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/monitor/join"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/promtest"
)

// daemon is rampartd run as a process, as an operator runs it, with its Prometheus
// metrics on a port of its own.
type daemon struct {
	socket, metrics string
	client          *api.Client
	log             *testenv.SyncBuffer
}

// startDaemon starts rampartd --metrics-address on an instance of the test's own, with
// endpoints in podCIDR; when the test ends it is stopped and its instance uninstalled.
func startDaemon(t *testing.T, podCIDR string) *daemon {
	t.Helper()
	bin := bins.Dir(t)
	inst := "tm" + testenv.Suffix(8)
	sockDir, err := os.MkdirTemp("", "rp-sock-") // short: a socket path has at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	d := &daemon{socket: filepath.Join(sockDir, "r.sock"), log: &testenv.SyncBuffer{}}
	flags := []string{"--instance", inst, "--state-dir", filepath.Join(t.TempDir(), "state"), "--socket", d.socket,
		"--bpf-dir", "/sys/fs/bpf/rampart/" + inst, "--node-netns", "rp-" + inst + "-node", "--pod-cidr", podCIDR}
	cmd := exec.Command(filepath.Join(bin, "rampartd"), append(slices.Clone(flags), "--metrics-address", "127.0.0.1:0")...)
	cmd.Stderr = d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.client = api.NewClient(d.socket)
	t.Cleanup(func() {
		d.client.Close()
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		if out, err := exec.Command(filepath.Join(bin, "rampartd"), append(slices.Clone(flags), "--uninstall")...).CombinedOutput(); err != nil {
			t.Errorf("uninstall: %v\n%s", err, out)
		}
	})
	addrRE := regexp.MustCompile(`msg="serving metrics" address=(127\.0\.0\.1:[0-9]+)`)
	if !testenv.Eventually(20*time.Second, func() bool {
		m := addrRE.FindStringSubmatch(d.log.String())
		if m == nil {
			return false
		}
		d.metrics = m[1]
		_, err := d.client.Status(context.Background())
		return err == nil
	}) {
		t.Fatalf("rampartd did not come up serving metrics:\n%s", d.log.String())
	}
	return d
}

// cli runs the CLI in-process against the daemon and fails the test unless it exits 0.
func (d *daemon) cli(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Run(context.Background(), append([]string{"--socket", d.socket}, args...), cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb}); code != 0 {
		t.Fatalf("rampart %s: exit %d\n%s%s\nagent log:\n%s", strings.Join(args, " "), code, out.String(), errb.String(), d.log.String())
	}
	return out.String()
}

// scrape reads the daemon's metrics as Prometheus does.
func (d *daemon) scrape(t *testing.T) promtest.Families {
	t.Helper()
	return promtest.Scrape(t, d.metrics)
}

// printedAlerts counts the alerts monitor run printed (-o json) that the join attributed
// to contract.
func printedAlerts(out *lockedBuffer, contract string) int {
	n := 0
	for _, line := range strings.Split(out.String(), "\n") {
		var a join.Alert
		if json.Unmarshal([]byte(line), &a) == nil && a.Event == "alert" &&
			slices.ContainsFunc(a.Contracts, func(c join.ContractRef) bool { return c.Name == contract }) {
			n++
		}
	}
	return n
}

// monitor run reports what it reads to the agent, which rampartd --metrics-address
// exports: as alerts are printed, rampart_monitor_alerts_total of the monitor, the mirror
// contract and the rule's severity comes to their number, and Suricata's capture count
// is above 0; after the interrupt, the counts include what Suricata flushed as it
// stopped; with the monitor endpoint deleted, its series are gone. The agent refuses the
// report of an endpoint that is no monitor.
func TestMonitorRunAlertsInMetrics(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("suricata"); err != nil {
		testenv.SkipOrFail(t, "suricata not installed (scripts/install-suricata.sh): %v", err)
	}
	d := startDaemon(t, "198.19.61.0/24")
	d.cli(t, "endpoint", "add", "shop/web", "--labels", "app=web")
	d.cli(t, "endpoint", "add", "shop/client", "--labels", "app=client")
	d.cli(t, "endpoint", "add", "sec/ids", "--monitor")
	ctx := context.Background()
	endpoint := func(ns, name string) api.Endpoint {
		ep, err := d.client.GetEndpoint(ctx, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		return ep
	}
	web, client := endpoint("shop", "web"), endpoint("shop", "client")
	srv, err := testenv.ServeHTTP(web.Netns, webPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)

	rule := fmt.Sprintf(`alert tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; priority:2; sid:1000021; rev:1;)`, webPort, attack, attack)
	out, errOut, stop := runMonitorAt(t, d.socket, "sec/ids", "--mode", "passive", "--rule", rule)
	d.cli(t, addWebTap("web-mirror", "mirror")...)
	const requests = 3
	for i := range requests {
		c := testenv.HTTPClient(client.Netns, 5*time.Second)
		resp, err := c.Post(fmt.Sprintf("http://%s:%d/", web.IP, webPort), "text/plain", strings.NewReader(fmt.Sprintf("buy %d %s", i, attack)))
		if err != nil {
			t.Fatalf("request %d through the mirror: %v", i, err)
		}
		resp.Body.Close()
		c.CloseIdleConnections()
	}
	if !testenv.Eventually(20*time.Second, func() bool { return printedAlerts(out, "web-mirror") >= requests }) {
		t.Fatalf("monitor run printed %d alerts of web-mirror for %d attacks:\n%s\nstderr:\n%s", printedAlerts(out, "web-mirror"), requests, out, errOut)
	}

	alerts := []string{"monitor", "sec/ids", "contract", "web-mirror", "severity", "2"}
	monitor := []string{"monitor", "sec/ids"}
	// reported waits until the agent's metrics count what monitor run printed.
	reported := func(when string) promtest.Families {
		t.Helper()
		var fams promtest.Families
		var got float64
		var printed int
		if !testenv.Eventually(10*time.Second, func() bool {
			fams = d.scrape(t)
			printed = printedAlerts(out, "web-mirror")
			got, _ = fams.Value("rampart_monitor_alerts_total", alerts...)
			return got == float64(printed)
		}) {
			t.Fatalf("%s: rampart_monitor_alerts_total%v = %v, monitor run printed %d\nstderr of monitor run:\n%s", when, alerts, got, printed, errOut)
		}
		t.Logf("%s: rampart_monitor_alerts_total%v = %v", when, alerts, got)
		return fams
	}
	fams := reported("while monitor run runs")
	// Suricata's stats come every second: its capture counters once it wrote one.
	if !testenv.Eventually(10*time.Second, func() bool {
		fams = d.scrape(t)
		n, _ := fams.Value("rampart_monitor_capture_packets_total", monitor...)
		return n > 0
	}) {
		t.Errorf("rampart_monitor_capture_packets_total%v stays 0 after %d mirrored connections", monitor, requests)
	}
	for _, name := range []string{"rampart_monitor_drops_total", "rampart_monitor_capture_kernel_drops_total"} {
		if v, ok := fams.Value(name, monitor...); !ok || v != 0 {
			t.Errorf("%s%v = %v (present %v), want 0 from a passive monitor that keeps up", name, monitor, v, ok)
		}
	}
	if ts, ok := fams.Value("rampart_monitor_last_report_timestamp_seconds", monitor...); !ok || time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("rampart_monitor_last_report_timestamp_seconds%v = %v (present %v), want about now", monitor, ts, ok)
	}

	if err := d.client.ReportMonitor(ctx, "shop", "web", api.MonitorReport{}); err == nil || !strings.Contains(err.Error(), "endpoint shop/web is not a monitor") {
		t.Errorf("report of shop/web: %v, want refused: not a monitor", err)
	}

	if code := stop(); code != 0 {
		t.Fatalf("monitor run exited %d after its interrupt:\n%s", code, errOut)
	}
	reported("after monitor run stopped")

	d.cli(t, "tap", "delete", "web-mirror")
	d.cli(t, "endpoint", "delete", "sec/ids")
	for _, name := range []string{"rampart_monitor_alerts_total", "rampart_monitor_capture_packets_total", "rampart_monitor_last_report_timestamp_seconds"} {
		if fams := d.scrape(t); fams[name] != nil {
			t.Errorf("%s after the monitor endpoint was deleted: %v", name, fams[name])
		}
	}
	if strings.Contains(errOut.String(), "warning: reporting") {
		t.Errorf("monitor run could not report:\n%s", errOut)
	}
}
