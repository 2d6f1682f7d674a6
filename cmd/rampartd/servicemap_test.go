package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/browser"
)

// TestServiceMapInBrowser runs rampartd with --ui-address, makes one allowed and one
// denied connection between real endpoints, and loads the service map in headless
// Chromium (Debian's package): the rendered page must show the namespaces and endpoints
// as nodes, the allowed edge as forwarded, and the denied one as dropped with its reason
// and the policy that denied it; the flow table's filters must select the drop.
// RAMPART_SERVICEMAP_SCREENSHOT=FILE also keeps its screenshot of the page there
// (docs/images/service-map.png was taken the same way, of an agent with more endpoints).
func TestServiceMapInBrowser(t *testing.T) {
	testenv.RequireRoot(t)
	br := browser.New(t)
	bin := bins.Dir(t)
	sockDir, flags := instanceFlags(t, "sm", "198.19.28.0/24")
	addr, log := startServing(t, bin, sockDir, flags, "serving the service map", "--ui-address", "127.0.0.1:0")
	must := mustCLI(t, bin, sockDir, log)
	must("endpoint", "add", "x/a", "--labels", "pod=a")
	must("endpoint", "add", "x/b", "--labels", "pod=b", "--ip", "198.19.28.50")
	must("endpoint", "add", "y/c", "--labels", "pod=c")
	serveTCP(t, bin, sockDir, "x/b", "80")
	// x/b admits x/a and denies namespace y outright (a deny rule wins over any allow).
	pol := filepath.Join(t.TempDir(), "b.yaml")
	doc := `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-ingress, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {pod: a}}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {k8s:io.kubernetes.pod.namespace: y}}]
`
	if err := os.WriteFile(pol, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	must("apply", "-f", pol)
	if !prober(bin, sockDir, "x/a", "198.19.28.50:80")() {
		t.Fatal("x/a -> x/b:80 blocked; the policy admits it")
	}
	if prober(bin, sockDir, "y/c", "198.19.28.50:80")() {
		t.Fatal("y/c -> x/b:80 passes an ingressDeny")
	}

	url := "http://" + addr + "/"
	browse := br.Run

	// The page polls the agent: the flows come within a poll or two of the flow reader.
	var dom string
	var problems []string
	if !testenv.Eventually(60*time.Second, func() bool {
		dom = browse("--dump-dom", url)
		problems = checkServiceMap(dom)
		return len(problems) == 0
	}) {
		t.Fatalf("the service map does not show what happened:\n%s\npage:\n%s", strings.Join(problems, "\n"), dom)
	}

	// The flow table's filters come from the query string.
	dom = browse("--dump-dom", url+"?verdict=DROPPED&pod=y/c&port=80")
	rows := browser.Elements(dom, "tr", "data-flow")
	if len(rows) == 0 {
		t.Fatalf("no flow row for ?verdict=DROPPED&pod=y/c&port=80:\n%s", dom)
	}
	for _, r := range rows {
		if r["data-verdict"] != "DROPPED" || r["data-source"] != "y/c" || r["data-destination"] != "x/b" {
			t.Errorf("filtered flow table shows %v", r)
		}
	}

	shot := filepath.Join(t.TempDir(), "map.png")
	browse("--window-size=1400,900", "--hide-scrollbars", "--screenshot="+shot, url)
	png, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("no screenshot: %v", err)
	}
	if keep := os.Getenv("RAMPART_SERVICEMAP_SCREENSHOT"); keep != "" {
		if err := os.WriteFile(keep, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkServiceMap lists what the rendered page lacks.
func checkServiceMap(dom string) []string {
	var problems []string
	for _, ns := range []string{"x", "y"} {
		if browser.Element(dom, "g", "data-namespace", ns, "class", "ns") == nil {
			problems = append(problems, "no namespace "+ns)
		}
	}
	for _, n := range []string{"x/a", "x/b", "y/c"} {
		if browser.Element(dom, "g", "data-node", n, "data-kind", "endpoint") == nil {
			problems = append(problems, "no node "+n)
		}
	}
	if e := browser.Element(dom, "g", "data-edge", "x/a->x/b"); e == nil || e["data-verdict"] != "FORWARDED" {
		problems = append(problems, "allowed edge x/a->x/b not forwarded: "+browser.Describe(e))
	}
	e := browser.Element(dom, "g", "data-edge", "y/c->x/b")
	if e == nil || e["data-verdict"] != "DROPPED" || e["class"] != "edge v-DROPPED" ||
		!strings.Contains(e["data-reasons"], "policy-deny") || !strings.Contains(e["data-policies"], "CiliumNetworkPolicy/x/b-ingress") {
		problems = append(problems, "denied edge y/c->x/b not marked dropped with its reason and policy: "+browser.Describe(e))
	}
	// The drop's reason and policy are written on the map, not only in attributes.
	label := regexp.MustCompile(`<text [^>]*data-edge-label="y/c-&gt;x/b"[^>]*>([^<]*)</text>`).FindStringSubmatch(dom)
	if label == nil || !strings.Contains(label[1], "policy-deny") || !strings.Contains(label[1], "CiliumNetworkPolicy/x/b-ingress") {
		problems = append(problems, "denied edge's label missing its reason or policy")
	}
	if browser.Element(dom, "tr", "data-edge", "y/c->x/b", "data-verdict", "DROPPED") == nil {
		problems = append(problems, "edge table has no dropped row for y/c->x/b")
	}
	return problems
}
