package npa

import (
	"bytes"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"

	"github.com/rampartnet/rampart/test/conformance/npa/nosctp"
)

// Features is what Rampart supports: the standard channel (ClusterNetworkPolicy) and named
// ports. Not ClusterNetworkPolicyEgressNodePeers: its tests' policies select nodes by label
// (`nodes: {matchExpressions: ...}`), which Rampart refuses (it does not know nodes'
// labels; docs/policy-language.md), so the suite skips those two tests.
var Features = sets.New(suite.SupportClusterNetworkPolicy, suite.SupportClusterNetworkPolicyNamedPorts)

// TestNPASuite runs upstream's conformance tests (tests.ConformanceTests) against the
// cluster of RAMPART_NPA_KUBECONFIG, each as a subtest named by its ShortName, the SCTP
// ones skipped (this kernel has no SCTP), then package nosctp's tests, if any, each named
// by its ShortName and "WithoutSCTP". Without RAMPART_NPA_KUBECONFIG it is skipped.
func TestNPASuite(t *testing.T) {
	kubeconfig := os.Getenv("RAMPART_NPA_KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("RAMPART_NPA_KUBECONFIG unset: run through test/conformance's TestNetworkPolicyAPI")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := suite.New(suite.Options{
		Client:               c,
		ClientSet:            clientset,
		KubeConfig:           *cfg,
		Debug:                os.Getenv("RAMPART_NPA_DEBUG") != "",
		CleanupBaseResources: true,
		SupportedFeatures:    Features.Clone(),
		FS:                   &Manifests,
	})
	s.Setup(t)
	for _, test := range tests.ConformanceTests {
		if strings.Contains(test.ShortName, "SCTP") {
			t.Run(test.ShortName, func(t *testing.T) { t.Skip("no SCTP in this kernel") })
			continue
		}
		t.Run(test.ShortName, func(t *testing.T) { test.Run(t, s) })
	}
	// The supplement, when test/conformance added it (package nosctp).
	for _, test := range nosctp.ConformanceTests {
		t.Run(test.ShortName+"WithoutSCTP", func(t *testing.T) { test.Run(t, s) })
	}
}

var update = flag.Bool("update", false, "rewrite base/ from the module's conformance/base")

// TestManifestsMatchUpstream checks that Manifests is upstream's v0.3.0 base manifests,
// file for file, base/manifests.yaml adapted by Adapt; with -update it writes them so.
func TestManifestsMatchUpstream(t *testing.T) {
	var n int
	err := fs.WalkDir(conformance.Manifests, "base", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		want, err := fs.ReadFile(conformance.Manifests, path)
		if err != nil {
			return err
		}
		if path == "base/manifests.yaml" {
			want = []byte(Adapt(string(want)))
		}
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			return os.WriteFile(path, want, 0o644)
		}
		got, err := fs.ReadFile(Manifests, path)
		if err != nil {
			t.Errorf("%s: not in the copy: %v", path, err)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from upstream's (adapted); go test -run TestManifestsMatchUpstream -update rewrites it", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no upstream manifest")
	}
	var copies int
	_ = fs.WalkDir(Manifests, "base", func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			copies++
		}
		return err
	})
	if copies != n && !*update {
		t.Errorf("%d files in the copy; upstream has %d", copies, n)
	}
}

// TestAdapt checks Adapt on upstream's lines: every bash command and client rewritten.
func TestAdapt(t *testing.T) {
	b, err := fs.ReadFile(conformance.Manifests, "base/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := Adapt(string(b))
	if strings.Contains(got, "/bin/bash") || strings.Contains(got, "porter") {
		t.Errorf("bash or porter left in the adapted manifests")
	}
	for _, want := range []string{
		`command: ["/agnhost", "serve-hostname", "--tcp", "--http=false", "--port", "80"]`,
		`command: ["/agnhost", "netexec", "--http-port", "{{ index .HostNetworkPorts 3 }}", "--udp-port", "{{ index .HostNetworkPorts 2 }}", "--udp-listen-addresses", "$(HOST_IP)"]`,
		"        - name: centaur-client\n          image: registry.k8s.io/e2e-test-images/agnhost:2.45\n          command: [\"/agnhost\", \"pause\"]\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("adapted manifests lack %q", want)
		}
	}
	if c := strings.Count(got, `command: ["/agnhost", "pause"]`); c != 15 {
		t.Errorf("%d pause commands; want 15 (5 clients, 10 SCTP servers)", c)
	}
}

// TestNoSCTP checks that NoSCTP takes every SCTP probe out of each of NoSCTPFiles and
// that no other upstream test that is not about SCTP probes it.
func TestNoSCTP(t *testing.T) {
	files, err := fs.Glob(conformance.Manifests, "tests/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("upstream's tests: %v (%d files)", err, len(files))
	}
	listed := sets.New(NoSCTPFiles...)
	for _, path := range files {
		name := filepath.Base(path)
		src, err := fs.ReadFile(conformance.Manifests, path)
		if err != nil {
			t.Fatal(err)
		}
		sctp := strings.Contains(string(src), `"sctp"`)
		switch {
		case listed.Has(name):
			out, err := NoSCTP(name, string(src))
			if err != nil {
				t.Error(err)
			} else if !strings.Contains(out, "\npackage nosctp\n") {
				t.Errorf("%s: no package nosctp", name)
			}
		case sctp && !strings.Contains(name, "sctp") && !strings.Contains(name, "experimental"):
			t.Errorf("%s probes SCTP and is not in NoSCTPFiles", name)
		}
	}
}
