package policy

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/manifests.golden from the corpus")

const goldenFile = "testdata/manifests.golden"

// corpusWant is the hand-checked verdict for one corpus file: accepted (field == "") with
// the given number of policies, whose rules are in testdata/manifests.golden, or rejected
// at exactly field with reason.
type corpusWant struct {
	policies int
	field    string
	reason   string
}

func accepted(n int) corpusWant { return corpusWant{policies: n} }

func rejected(field string) corpusWant {
	return corpusWant{field: field, reason: ReasonNotSupported}
}

// corpusDir holds the manifest corpus: real published manifests, copied byte for byte;
// its README.md names the repository, path and commit each file came from.
const corpusDir = "testdata/manifests"

// corpus lists every file of corpusDir (README.md aside). Each rejection names
// the first unsupported field in document order; the reason for each is in the file:
// Kafka L7 rules, HTTP rules towards FQDN peers, services, requires, extended protocols (VRRP), SNI,
// Envoy listeners, auth.
var corpus = map[string]corpusWant{
	"cilium-examples/minikube/dns_policy_with_l7.yaml":                              {field: "specs[0].egress[0].toFQDNs", reason: "L7 rules towards toFQDNs peers " + ReasonNotSupported},
	"cilium-examples/minikube/sw_deny_policy.yaml":                                  accepted(1),
	"cilium-examples/minikube/sw_l3_l4_l7_policy.yaml":                              accepted(1),
	"cilium-examples/minikube/sw_l3_l4_policy.yaml":                                 accepted(1),
	"cilium-examples/policies/auth/auth.yaml":                                       rejected("spec.egress[0].auth"),
	"cilium-examples/policies/cidr.yaml":                                            accepted(1),
	"cilium-examples/policies/entities.yaml":                                        accepted(1),
	"cilium-examples/policies/getting-started/dns-pattern.yaml":                     accepted(1),
	"cilium-examples/policies/getting-started/kafka.yaml":                           rejected("spec.ingress[0].toPorts[0].rules.kafka"),
	"cilium-examples/policies/host/allow-extended-protocols.yaml":                   {field: "spec.egress[0].toPorts[0].ports[5].protocol", reason: `protocol "VRRP" ` + ReasonNotSupported},
	"cilium-examples/policies/host/demo-host-policy.yaml":                           accepted(1),
	"cilium-examples/policies/host/lock-down-dev-vms.yaml":                          accepted(1),
	"cilium-examples/policies/host/lock-down-ingress.yaml":                          accepted(1),
	"cilium-examples/policies/kubernetes/clustermesh/cross-cluster-policy.yaml":     accepted(1),
	"cilium-examples/policies/kubernetes/clusterwide/clusterscope-policy.yaml":      accepted(1),
	"cilium-examples/policies/kubernetes/namespace/isolate-namespaces.yaml":         accepted(2),
	"cilium-examples/policies/kubernetes/namespace/kubedns-policy.yaml":             accepted(1),
	"cilium-examples/policies/kubernetes/namespace/namespace-labels-policy.yaml":    accepted(1),
	"cilium-examples/policies/kubernetes/serviceaccount/serviceaccount-policy.yaml": accepted(1),
	"cilium-examples/policies/l3/cidr/cidr.yaml":                                    accepted(1),
	"cilium-examples/policies/l3/egress-default-deny/egress-default-deny.yaml":      accepted(1),
	"cilium-examples/policies/l3/egress-deny/egress-deny.yaml":                      accepted(1),
	"cilium-examples/policies/l3/entities/apiserver.yaml":                           accepted(1),
	"cilium-examples/policies/l3/entities/from_world_deny.yaml":                     accepted(1),
	"cilium-examples/policies/l3/entities/nodes.yaml":                               accepted(1),
	"cilium-examples/policies/l3/fqdn/fqdn.yaml":                                    accepted(1),
	"cilium-examples/policies/l3/match-expressions/and-statement.yaml":              accepted(1),
	"cilium-examples/policies/l3/match-expressions/or-statement.yaml":               accepted(1),
	"cilium-examples/policies/l3/requires/requires.yaml":                            rejected("specs[0].ingress[0].fromRequires"),
	"cilium-examples/policies/l3/service/service.yaml":                              rejected("spec.egress[0].toServices"),
	"cilium-examples/policies/l4/cidr_l4_combined.yaml":                             accepted(1),
	"cilium-examples/policies/l4/envoy_listener_redirect.yaml":                      rejected("spec.egress[0].toPorts[0].listener"),
	"cilium-examples/policies/l4/icmp.yaml":                                         accepted(1),
	"cilium-examples/policies/l4/l4.yaml":                                           accepted(1),
	"cilium-examples/policies/l4/l4_port_range.yaml":                                accepted(1),
	"cilium-examples/policies/l4/l4_sni.yaml":                                       rejected("spec.egress[0].toPorts[0].serverNames"),
	"cilium-examples/policies/l7/dns/dns.yaml":                                      accepted(1),
	"cilium-examples/policies/l7/http/http.json":                                    accepted(1),
	"cilium-examples/policies/l7/http/http.yaml":                                    accepted(1),
	"cilium-examples/policies/l7/http/l7_multi.yaml":                                accepted(1),
	"cilium-examples/policies/l7/kafka/kafka-role.yaml":                             rejected("spec.ingress[0].toPorts[0].rules.kafka"),
	"k8s-docs/network-policy-allow-all-egress-deny-all-ingress.yaml":                accepted(1),
	"k8s-docs/network-policy-allow-all-egress.yaml":                                 accepted(1),
	"k8s-docs/network-policy-allow-all-ingress.yaml":                                accepted(1),
	"k8s-docs/network-policy-default-deny-all.yaml":                                 accepted(1),
	"k8s-docs/network-policy-default-deny-egress.yaml":                              accepted(1),
	"k8s-docs/network-policy-default-deny-ingress.yaml":                             accepted(1),
	"k8s-docs/networkpolicy-multiport-egress.yaml":                                  accepted(1),
	"k8s-docs/networkpolicy.yaml":                                                   accepted(1),
	"k8s-docs/nginx-policy.yaml":                                                    accepted(1),
	"k8s-recipes/01-deny-all-traffic-to-an-application.yaml":                        accepted(1),
	"k8s-recipes/02-limit-traffic-to-an-application.yaml":                           accepted(1),
	"k8s-recipes/02a-allow-all-traffic-to-an-application.yaml":                      accepted(1),
	"k8s-recipes/03-deny-all-non-whitelisted-traffic-in-the-namespace.yaml":         accepted(1),
	"k8s-recipes/04-deny-traffic-from-other-namespaces.yaml":                        accepted(1),
	"k8s-recipes/05-allow-traffic-from-all-namespaces.yaml":                         accepted(1),
	"k8s-recipes/06-allow-traffic-from-a-namespace.yaml":                            accepted(1),
	"k8s-recipes/07-allow-traffic-from-some-pods-in-another-namespace.yaml":         accepted(1),
	"k8s-recipes/08-allow-external-traffic.yaml":                                    accepted(1),
	"k8s-recipes/09-allow-traffic-only-to-a-port.yaml":                              accepted(1),
	"k8s-recipes/10-allowing-traffic-with-multiple-selectors.yaml":                  accepted(1),
	"k8s-recipes/11-deny-egress-traffic-from-an-application-2.yaml":                 accepted(1),
	"k8s-recipes/11-deny-egress-traffic-from-an-application.yaml":                   accepted(1),
	"k8s-recipes/12-deny-all-non-whitelisted-traffic-from-the-namespace.yaml":       accepted(1),
	"k8s-recipes/14-deny-external-egress-traffic.yaml":                              accepted(1),
}

func TestCorpus(t *testing.T) {
	dir := corpusDir
	var files []string
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || de.Name() == "README.md" {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) != 65 || len(corpus) != 65 {
		t.Errorf("corpus has %d files and the table %d entries, want 65", len(files), len(corpus))
	}
	for f := range corpus {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("table entry %s: %v", f, err)
		}
	}

	var golden strings.Builder
	golden.WriteString("# Rules of every manifest in testdata/manifests, as Rampart understands them.\n")
	golden.WriteString("# Regenerate with: go test ./internal/policy -run TestCorpus -update\n")
	golden.WriteString("# Selector syntax: k=v, k in (..), k notin (..), k (exists), !k (does not exist).\n")
	nAccepted, nRejected := 0, 0
	for _, f := range files {
		want, ok := corpus[f]
		if !ok {
			t.Errorf("%s: not in the hand-checked table", f)
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		golden.WriteString("\n=== " + f + "\n")
		ps, err := ParseDocuments(f, data)
		if want.field == "" {
			nAccepted++
			if err != nil {
				t.Errorf("%s: want accepted, got %v", f, err)
				continue
			}
			if len(ps) != want.policies {
				t.Errorf("%s: got %d policies, want %d", f, len(ps), want.policies)
			}
			for _, p := range ps {
				golden.WriteString(Format(p))
				checkRawRoundTrip(t, p)
			}
			continue
		}
		nRejected++
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%s: want rejected at %s, got %v", f, want.field, err)
			continue
		}
		if pe.Field != want.field || pe.Reason != want.reason || pe.Line == 0 || pe.Document != 1 {
			t.Errorf("%s: rejected with %v\nwant field %s, reason %q", f, pe, want.field, want.reason)
		}
		golden.WriteString("rejected: " + pe.Error() + "\n")
	}
	t.Logf("%d accepted, %d rejected", nAccepted, nRejected)

	if *update {
		if err := os.WriteFile(goldenFile, []byte(golden.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(old) != golden.String() {
		t.Errorf("%s is out of date; diff the output of -update and check the meaning by hand:\n%s", goldenFile, firstDiff(string(old), golden.String()))
	}
}

// checkRawRoundTrip checks that Raw parses back to the same rules.
func checkRawRoundTrip(t *testing.T, p *Policy) {
	t.Helper()
	back, err := ParseDocuments("raw.json", p.Raw)
	if err != nil || len(back) != 1 {
		t.Errorf("%s: Raw does not parse back: %v\n%s", p.Source, err, p.Raw)
		return
	}
	// A rule array's Raw holds its rules under specs, so "[0].ingress[0]" comes back as
	// "specs[0].ingress[0]"; nothing else may change.
	want := *p
	want.Rules = slices.Clone(p.Rules)
	for i := range want.Rules {
		if strings.HasPrefix(want.Rules[i].Description, "[") {
			want.Rules[i].Description = "specs" + want.Rules[i].Description
		}
	}
	if back[0].Key() != p.Key() || rules(back[0]) != rules(&want) {
		t.Errorf("%s: Raw parses back to different rules:\n%s\nwant\n%s", p.Source, rules(back[0]), rules(&want))
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + strconv.Itoa(i+1) + ":\n  golden: " + x + "\n  now:    " + y
		}
	}
	return ""
}
