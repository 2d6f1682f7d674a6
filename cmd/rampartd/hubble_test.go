package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rampartnet/rampart/internal/hubble/flowpb"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// TestHubbleCLI runs the real hubble CLI (scripts/build-hubble.sh) against a real rampartd
// serving --hubble-address: real traffic between two endpoints, one port allowed by a
// NetworkPolicy and one not, must show in hubble observe's JSON as Hubble shows it, with
// the verdicts, addresses, ports, pod names and drop reason, and hubble's filters must
// select them.
func TestHubbleCLI(t *testing.T) {
	testenv.RequireRoot(t)
	root := testenv.ModuleRoot(t)
	vers := k8stest.Versions(t, filepath.Join(root, "tools", "hubble", "versions.env"))
	hubble := filepath.Join(k8stest.Cache(), "hubble-"+vers["HUBBLE_VERSION"], "hubble")
	if _, err := os.Stat(hubble); err != nil {
		testenv.SkipOrFail(t, "hubble CLI missing (build with scripts/build-hubble.sh): %v", err)
	}
	bin := bins.Dir(t)
	sockDir, flags := instanceFlags(t, "h", "198.18.0.0/24")
	inst := flagValue(flags, "--instance")
	server := "unix://" + filepath.Join(sockDir, "hubble.sock")
	flags = append(flags, "--node-name", "node-"+inst, "--hubble-address", server)
	var daemonLog testenv.SyncBuffer
	daemon := exec.Command(bin+"/rampartd", flags...)
	daemon.Stderr = &daemonLog
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the agent stops, then --uninstall removes what it made.
	t.Cleanup(func() { exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).Run() })
	t.Cleanup(func() {
		daemon.Process.Signal(syscall.SIGTERM)
		daemon.Wait()
	})
	if !testenv.Eventually(10*time.Second, func() bool {
		_, _, code := run(bin, sockDir, "status")
		return code == 0
	}) {
		t.Fatalf("rampartd did not come up:\n%s", daemonLog.String())
	}
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := run(bin, sockDir, args...)
		if code != 0 {
			t.Fatalf("rampart %v: exit %d: %s %s\nagent log:\n%s", args, code, out, errs, daemonLog.String())
		}
		return out
	}
	must("endpoint", "add", "x/client-1", "--labels", "app=client", "--ip", "198.18.0.40")
	must("endpoint", "add", "y/web", "--labels", "app=web", "--ip", "198.18.0.50")
	serveTCP(t, bin, sockDir, "y/web", "80,81")
	policy := filepath.Join(t.TempDir(), "web.yaml")
	os.WriteFile(policy, []byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-80, namespace: y}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 80}]
`), 0o644)
	must("apply", "-f", policy)
	probe := func(port int) bool {
		_, _, code := run(bin, sockDir, "endpoint", "exec", "x/client-1", "--", bin+"/rampart-testserver", "probe",
			"--tcp", fmt.Sprintf("198.18.0.50:%d", port), "--timeout", "500ms")
		return code == 0
	}
	if !probe(80) {
		t.Fatalf("x/client-1 -> y/web:80 blocked, the policy allows it\nagent log:\n%s", daemonLog.String())
	}
	if probe(81) {
		t.Fatal("x/client-1 -> y/web:81 passes, the policy does not allow it")
	}

	// observe runs hubble observe -o json with args and returns the flows it printed.
	observe := func(args ...string) []*flowpb.Flow {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, hubble, append([]string{"observe", "--server", server, "-o", "json"}, args...)...)
		c.Env = append(os.Environ(), "HOME="+t.TempDir()) // no user configuration
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		if err := c.Run(); err != nil {
			t.Fatalf("hubble observe %v: %v\n%s", args, err, errb.String())
		}
		var fs []*flowpb.Flow
		sc := bufio.NewScanner(&out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r observerpb.GetFlowsResponse
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("hubble observe printed %q: %v", sc.Text(), err)
			}
			if r.GetFlow() == nil {
				continue
			}
			if r.GetNodeName() != "node-"+inst {
				t.Errorf("node_name %q, want node-%s", r.GetNodeName(), inst)
			}
			fs = append(fs, r.GetFlow())
		}
		return fs
	}
	// to finds the flow to port with verdict v at y/web's ingress (the connection's new
	// flow is also reported at x/client-1's egress).
	to := func(fs []*flowpb.Flow, port uint32, v flowpb.Verdict) *flowpb.Flow {
		for _, f := range fs {
			if f.GetL4().GetTCP().GetDestinationPort() == port && f.GetVerdict() == v && f.GetTrafficDirection() == flowpb.TrafficDirection_INGRESS {
				return f
			}
		}
		return nil
	}

	var all []*flowpb.Flow
	if !testenv.Eventually(10*time.Second, func() bool {
		all = observe("--last", "50")
		return to(all, 80, flowpb.Verdict_FORWARDED) != nil && to(all, 81, flowpb.Verdict_DROPPED) != nil
	}) {
		t.Fatalf("hubble observe --last 50: no allowed flow to port 80 and dropped flow to port 81 in %d flows:\n%v", len(all), all)
	}
	ok := to(all, 80, flowpb.Verdict_FORWARDED)
	drop := to(all, 81, flowpb.Verdict_DROPPED)
	for _, c := range []struct {
		name string
		f    *flowpb.Flow
	}{{"allowed", ok}, {"dropped", drop}} {
		f := c.f
		if f.GetIP().GetSource() != "198.18.0.40" || f.GetIP().GetDestination() != "198.18.0.50" || f.GetIP().GetIpVersion() != flowpb.IPVersion_IPv4 ||
			f.GetSource().GetNamespace() != "x" || f.GetSource().GetPodName() != "client-1" ||
			f.GetDestination().GetNamespace() != "y" || f.GetDestination().GetPodName() != "web" ||
			f.GetSource().GetIdentity() == 0 || f.GetDestination().GetIdentity() == 0 ||
			f.GetL4().GetTCP().GetSourcePort() == 0 || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS ||
			f.GetNodeName() != "node-"+inst || f.GetTime() == nil {
			t.Errorf("%s flow: %v", c.name, f)
		}
	}
	if ok.GetEventType().GetType() != 5 || ok.GetIsReply() == nil || ok.GetIsReply().GetValue() ||
		len(ok.GetIngressAllowedBy()) != 1 || ok.GetIngressAllowedBy()[0].GetName() != "web-80" || ok.GetIngressAllowedBy()[0].GetNamespace() != "y" {
		t.Errorf("allowed flow: want a policy verdict, not a reply, allowed by y/web-80: %v", ok)
	}
	if drop.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || drop.GetEventType().GetType() != 1 {
		t.Errorf("dropped flow: want a drop event with POLICY_DENIED: %v", drop)
	}

	// hubble's filters: only drops to y/web; only x/client-1's flows to port 80.
	drops := observe("--last", "50", "--verdict", "DROPPED", "--to-pod", "y/web")
	if to(drops, 81, flowpb.Verdict_DROPPED) == nil {
		t.Errorf("--verdict DROPPED --to-pod y/web: no drop to port 81 in %v", drops)
	}
	for _, f := range drops {
		if f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetDestination().GetPodName() != "web" {
			t.Errorf("--verdict DROPPED --to-pod y/web printed %v", f)
		}
	}
	port80 := observe("--last", "50", "--from-pod", "x/client", "--port", "80", "--type", "policy-verdict")
	if to(port80, 80, flowpb.Verdict_FORWARDED) == nil {
		t.Errorf("--from-pod x/client --port 80: no allowed flow in %v", port80)
	}
	for _, f := range port80 {
		if f.GetSource().GetPodName() != "client-1" || f.GetL4().GetTCP().GetDestinationPort() != 80 && f.GetL4().GetTCP().GetSourcePort() != 80 {
			t.Errorf("--from-pod x/client --port 80 printed %v", f)
		}
	}
	if fs := observe("--last", "50", "--namespace", "z"); len(fs) != 0 {
		t.Errorf("--namespace z printed %d flows: %v", len(fs), fs)
	}

	// hubble status checks the server's health, then reads ServerStatus.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := exec.CommandContext(ctx, hubble, "status", "--server", server).CombinedOutput()
	if err != nil || !strings.Contains(string(st), "Current/Max Flows") {
		t.Errorf("hubble status: %v\n%s", err, st)
	}
	t.Logf("hubble status:\n%s", st)
}
