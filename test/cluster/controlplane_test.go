package cluster

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// writeManifest writes s to a file in the test's temporary directory.
func writeManifest(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func kubectl(t *testing.T, c *k8stest.Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// The control plane starts and serves: /readyz ok, the version kubectl parses is the one
// built, NetworkPolicy applies through the real kubectl and reads back through client-go.
func TestControlPlaneServes(t *testing.T) {
	c := k8stest.Start(t)
	if !c.Ready() {
		t.Fatal("/readyz not ok after Start")
	}

	var v struct {
		ServerVersion struct{ Major, Minor, GitVersion string }
	}
	out := kubectl(t, c, "version", "-o", "json")
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("kubectl version -o json: %v\n%s", err, out)
	}
	if v.ServerVersion.GitVersion != "v1.37.2" || v.ServerVersion.Major != "1" || v.ServerVersion.Minor != "37" {
		t.Errorf("server version %+v, want v1.37.2 (1, 37)", v.ServerVersion)
	}

	ns := "rampart-" + testenv.Suffix(6)
	kubectl(t, c, "create", "namespace", ns)
	np := writeManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-b
spec:
  podSelector:
    matchLabels: {app: a}
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {org: b}
    ports:
    - {protocol: TCP, port: 80}
`)
	if out := kubectl(t, c, "apply", "-n", ns, "-f", np); !strings.Contains(out, "networkpolicy.networking.k8s.io/allow-b created") {
		t.Errorf("kubectl apply: %s", out)
	}
	got, err := c.Client.NetworkingV1().NetworkPolicies(ns).Get(ctxT(t), "allow-b", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the policy back: %v", err)
	}
	if got.Spec.PodSelector.MatchLabels["app"] != "a" || len(got.Spec.Ingress) != 1 || got.Spec.Ingress[0].Ports[0].Port.IntValue() != 80 {
		t.Errorf("policy read back: %+v", got.Spec)
	}
	// The API server validates NetworkPolicy itself: a port out of range is refused.
	bad := writeManifest(t, strings.Replace(strings.Replace(string(mustRead(t, np)), "port: 80", "port: 70000", 1), "allow-b", "bad", 1))
	if out, err := c.Kubectl("apply", "-n", ns, "-f", bad); err == nil || !strings.Contains(out, "70000") {
		t.Errorf("kubectl apply of port 70000: err %v, output %s; want refused naming the port", err, out)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The CRDs install, become Established, and serve each kind at the versions users write;
// their schemas refuse what is not a policy or not a CIDR.
func TestCRDs(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	c.InstallCRDs(t) // again: installing is idempotent

	out := kubectl(t, c, "get", "crd", "-o", "jsonpath={range .items[*]}{.metadata.name}:{.status.conditions[?(@.type==\"Established\")].status} {end}")
	for _, want := range []string{"ciliumnetworkpolicies.cilium.io:True", "ciliumclusterwidenetworkpolicies.cilium.io:True", "ciliumcidrgroups.cilium.io:True", "securityidentities.rampart.io:True", "securityidentityclaims.rampart.io:True",
		"tapcontracts.rampart.io:True", "acceptedpolicies.rampart.io:True", "trafficcontrols.crd.antrea.io:True"} {
		if !slices.Contains(strings.Fields(out), want) {
			t.Errorf("CRDs %q: want %s", out, want)
		}
	}
	out = kubectl(t, c, "api-resources", "--api-group=cilium.io", "--no-headers")
	shortNames := map[string]string{} // resource name -> short names
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 5 { // NAME SHORTNAMES APIVERSION NAMESPACED KIND
			shortNames[f[0]] = f[1]
		}
	}
	for name, want := range map[string]string{"ciliumnetworkpolicies": "cnp,ciliumnp", "ciliumclusterwidenetworkpolicies": "ccnp", "ciliumcidrgroups": "ccg"} {
		if shortNames[name] != want {
			t.Errorf("api-resources: %s short names %q, want %q:\n%s", name, shortNames[name], want, out)
		}
	}

	for _, version := range []string{"v2alpha1", "v2"} {
		m := writeManifest(t, "apiVersion: cilium.io/"+version+"\nkind: CiliumCIDRGroup\nmetadata:\n  name: group-"+version+"\nspec:\n  externalCIDRs: [198.18.0.0/24, \"2001:db8::/64\"]\n")
		kubectl(t, c, "apply", "-f", m)
		if out := kubectl(t, c, "get", "ciliumcidrgroups.cilium.io", "group-"+version, "-o", "jsonpath={.spec.externalCIDRs}"); !strings.Contains(out, "198.18.0.0/24") {
			t.Errorf("CIDR group %s read back: %s", version, out)
		}
	}
	for _, tc := range []struct{ name, manifest, want string }{
		{"cidr", "apiVersion: cilium.io/v2alpha1\nkind: CiliumCIDRGroup\nmetadata: {name: bad}\nspec:\n  externalCIDRs: [not-a-cidr]\n", "externalCIDRs"},
		{"no cidrs", "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: bad}\nspec: {}\n", "externalCIDRs"},
		{"spec type", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: bad, namespace: default}\nspec: allow-all\n", "spec"},
		{"rules type", "apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: bad}\nspec:\n  endpointSelector: {}\n  ingress: {fromEntities: [world]}\n", "ingress"},
	} {
		out, err := c.Kubectl("apply", "-f", writeManifest(t, tc.manifest))
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: kubectl apply: err %v, output %s; want refused naming %s", tc.name, err, out, tc.want)
		}
	}
}

// corpusDir is the manifest corpus of internal/policy (real published manifests).
const corpusDir = "internal/policy/testdata/manifests"

// corpusExceptions are the corpus files Rampart's parser accepts that plain `kubectl apply`
// does not store as written, checked by hand. Each is then applied the way that does.
var corpusExceptions = map[string]struct {
	refused string // the API server refuses it, naming this
	// nullDropped: client-side apply drops a field written as null (here `egress:`, which
	// Rampart reads as an empty egress section, so default deny), so what is stored means
	// something else; server-side apply keeps the null.
	nullDropped bool
}{
	// metadata is the API server's own ObjectMeta, which no CRD schema can widen: strict
	// field validation (kubectl's default) refuses the unknown field; --validate=warn drops
	// it, which changes no rule.
	"cilium-examples/policies/kubernetes/clustermesh/cross-cluster-policy.yaml": {refused: `unknown field "metadata.description"`},
	"cilium-examples/policies/l3/egress-default-deny/egress-default-deny.yaml":  {nullDropped: true},
}

// Every corpus manifest Rampart's parser accepts is applied with the real kubectl as
// written, and what the server stores parses to the same rules (the schemas prune nothing
// Rampart reads), except the hand-checked corpusExceptions, which fail exactly as listed and
// are then applied the way that keeps them. The one file that is not a Kubernetes object, a
// Cilium JSON rule array, is applied as the CiliumNetworkPolicy Rampart makes of it.
func TestCorpusAppliesWithKubectl(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	root := filepath.Join(testenv.ModuleRoot(t), corpusDir)
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != "README.md" {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	namespaces := map[string]bool{"default": true}
	applied, refusedByRampart := 0, 0
	seen := map[string]bool{}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		data := mustRead(t, f)
		docs, err := policy.Parse(rel, data)
		if err != nil {
			refusedByRampart++
			continue
		}
		for _, p := range docs.Policies {
			if p.Namespace != "" && !namespaces[p.Namespace] {
				kubectl(t, c, "create", "namespace", p.Namespace)
				namespaces[p.Namespace] = true
			}
		}
		file := f
		var obj struct{ Kind string }
		if strings.HasSuffix(f, ".json") && json.Unmarshal(data, &obj) != nil {
			// A rule array (`cilium policy import`), which kubectl cannot apply: apply the
			// CiliumNetworkPolicy Rampart made of it instead.
			if len(docs.Policies) != 1 {
				t.Fatalf("%s: %d policies from a rule array", rel, len(docs.Policies))
			}
			file = filepath.Join(t.TempDir(), "raw.json")
			if err := os.WriteFile(file, docs.Policies[0].Raw, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: a Cilium rule array, not a Kubernetes object: applied as the CiliumNetworkPolicy Rampart makes of it", rel)
		}
		exc := corpusExceptions[rel]
		seen[rel] = true
		out, err := c.Kubectl("apply", "-f", file)
		switch {
		case exc.refused != "":
			if err == nil || !strings.Contains(out, exc.refused) {
				t.Errorf("%s: want refused with %s, got %v\n%s", rel, exc.refused, err, out)
			}
			t.Logf("%s: refused by the API server: %s; applied with --validate=warn", rel, exc.refused)
			out, err = c.Kubectl("apply", "--validate=warn", "-f", file)
		case err != nil:
			t.Errorf("%s: accepted by Rampart, refused by the API server: %v\n%s", rel, err, out)
			continue
		case exc.nullDropped:
			for _, p := range docs.Policies {
				if same, stored, want := storedSame(t, c, p); same {
					t.Errorf("%s: stored as written after client-side apply, want the null field dropped:\n%s\n%s", rel, stored, want)
				}
			}
			t.Logf("%s: client-side apply drops a field written as null; applied again with --server-side", rel)
			kubectl(t, c, "delete", "-f", file)
			out, err = c.Kubectl("apply", "--server-side", "-f", file)
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", rel, err, out)
			continue
		}
		applied++
		for _, p := range docs.Policies {
			if same, stored, want := storedSame(t, c, p); !same {
				t.Errorf("%s: %s/%s as stored has other rules:\nstored:\n%s\nfile:\n%s", rel, p.Kind, p.Name, stored, want)
			}
		}
	}
	for rel := range corpusExceptions {
		if !seen[rel] {
			t.Errorf("corpusExceptions lists %s, which is not a corpus file Rampart accepts", rel)
		}
	}
	t.Logf("%d corpus files applied; %d refused by Rampart's parser (not sent)", applied, refusedByRampart)
	if applied < 40 {
		t.Errorf("only %d corpus files applied; the corpus has 65, about 50 of which Rampart accepts", applied)
	}
}

// storedSame reads p back from the API server and reports whether it parses to the same
// rules, with both sides' rules as text.
func storedSame(t *testing.T, c *k8stest.Cluster, p *policy.Policy) (bool, string, string) {
	t.Helper()
	resource := map[policy.Kind]string{
		policy.KindNetworkPolicy:           "networkpolicies.networking.k8s.io",
		policy.KindCiliumNetworkPolicy:     "ciliumnetworkpolicies.cilium.io",
		policy.KindCiliumClusterwidePolicy: "ciliumclusterwidenetworkpolicies.cilium.io",
	}[p.Kind]
	args := []string{"get", resource, p.Name, "-o", "json"}
	if p.Namespace != "" {
		args = append(args, "-n", p.Namespace)
	}
	stored := rules(t, []byte(kubectl(t, c, args...)))
	want := rules(t, p.Raw)
	return stored == want, stored, want
}

// rules parses one policy document and returns its rules as text, in a form that does not
// depend on how the document was written: its objects' keys sorted (the server returns them
// so), and without each rule's description (the path of its source field, which changes
// when the server fills in a default such as NetworkPolicy's policyTypes).
func rules(t *testing.T, doc []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	sorted, err := json.Marshal(v) // encoding/json writes map keys sorted
	if err != nil {
		t.Fatal(err)
	}
	ps, err := policy.ParseDocuments("doc.json", sorted)
	if err != nil || len(ps) != 1 {
		t.Fatalf("does not parse to one policy: %v\n%s", err, doc)
	}
	for i := range ps[0].Rules {
		ps[0].Rules[i].Description = ""
	}
	_, r, _ := strings.Cut(policy.Format(ps[0]), "\n") // the first line names the source
	return r
}

// Restarting etcd on the same data directory loses nothing: objects written before are
// served after, and the API server reconnects by itself.
func TestEtcdRestartKeepsObjects(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	ns := "rampart-" + testenv.Suffix(6)
	ctx := ctxT(t)
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before", Namespace: ns}, Data: map[string]string{"k": "v"}}
	if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(t, c, "apply", "-f", writeManifest(t, "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: before, namespace: "+ns+"}\nspec:\n  endpointSelector: {matchLabels: {app: a}}\n  ingress: [{fromEndpoints: [{matchLabels: {app: b}}]}]\n"))

	if err := c.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	// With etcd down the API server is not ready: the restart below is a real one.
	if !testenv.Eventually(30*time.Second, func() bool { return !c.Ready() }) {
		t.Fatal("API server still ready with etcd stopped")
	}
	if err := c.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	c.WaitReady(t, 60*time.Second)

	got, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "before", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Errorf("ConfigMap after the restart: %v, %v", got, err)
	}
	out := kubectl(t, c, "get", "cnp", "before", "-n", ns, "-o", "jsonpath={.spec.ingress[0].fromEndpoints[0].matchLabels.app}")
	if out != "b" {
		t.Errorf("CiliumNetworkPolicy after the restart: %q, want its rule's peer app=b", out)
	}
	// And it still takes writes.
	cm.Name = "after"
	if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Errorf("write after the restart: %v", err)
	}
}
