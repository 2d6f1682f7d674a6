package deploy

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/rampartnet/rampart/internal/testenv"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampartd", "./cmd/rampart"}}

func TestMain(m *testing.M) { bins.Main(m) }

// decodeFile reads the one object of a deploy/ file (or another directory's, name
// relative to the module root with a slash) into obj.
func decodeFile(t *testing.T, name string, obj any) {
	t.Helper()
	if !strings.Contains(name, "/") {
		name = filepath.Join("deploy", name)
	}
	f, err := os.Open(filepath.Join(testenv.ModuleRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(obj); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// The DaemonSet's command line, with the ConfigMap's values put in as the kubelet does,
// is one rampartd accepts; its readiness probe is one rampart accepts; every setting of the
// ConfigMap reaches a flag.
func TestDaemonSetArgs(t *testing.T) {
	var ds appsv1.DaemonSet
	decodeFile(t, "daemonset.yaml", &ds)
	var cm corev1.ConfigMap
	decodeFile(t, "config.yaml", &cm)
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("DaemonSet has %d containers, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	c := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	used := map[string]bool{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "node-1"
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			if ref.Name != cm.Name {
				t.Errorf("env %s refers to ConfigMap %s, want %s", e.Name, ref.Name, cm.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				t.Errorf("env %s: key %q not in the ConfigMap", e.Name, ref.Key)
			}
			used[ref.Key] = true
			if ok {
				env[e.Name] = v
			}
		}
	}
	for k := range cm.Data {
		if !used[k] {
			t.Errorf("ConfigMap key %q reaches no flag", k)
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	var args []string
	for _, a := range c.Args {
		args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[m[2:len(m)-1]]
			if !ok {
				t.Errorf("argument %q: %s is not set", a, m)
			}
			return v
		}))
	}
	// Prometheus finds the agents by the pod annotations: the port they name is the one
	// the agent serves on.
	ann := ds.Spec.Template.Annotations
	var metricsAddr string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-address="); ok {
			metricsAddr = v
		}
	}
	if _, port, err := net.SplitHostPort(metricsAddr); err != nil || ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != port || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("--metrics-address %q (%v) and annotations %v: want the annotations to scrape its port at /metrics", metricsAddr, err, ann)
	}
	bin := bins.Dir(t)
	if len(c.Command) != 1 || filepath.Base(c.Command[0]) != "rampartd" {
		t.Fatalf("command %v, want rampartd", c.Command)
	}
	// --version is acted on after every flag was parsed: an unknown flag or a bad value
	// of a typed flag (duration, bool) fails first.
	out, err := exec.Command(filepath.Join(bin, "rampartd"), append(args, "--version")...).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "rampartd ") {
		t.Errorf("rampartd %v --version: %v\n%s", args, err, out)
	}
	probe := c.ReadinessProbe
	if probe == nil || probe.Exec == nil || len(probe.Exec.Command) < 2 || filepath.Base(probe.Exec.Command[0]) != "rampart" {
		t.Fatalf("readiness probe %+v, want an exec of rampart", probe)
	}
	out, err = exec.Command(filepath.Join(bin, "rampart"), append(probe.Exec.Command[1:], "--help")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--ready") {
		t.Errorf("rampart %v --help: %v\n%s", probe.Exec.Command[1:], err, out)
	}
}

// The uninstall DaemonSet (deploy-uninstall/) runs a command line rampartd accepts, and
// mounts every host path the agent's DaemonSet mounts at the same place in the container,
// so that it finds what the agent made where the agent made it.
func TestUninstallDaemonSet(t *testing.T) {
	var agent, uninstall appsv1.DaemonSet
	decodeFile(t, "daemonset.yaml", &agent)
	decodeFile(t, "deploy-uninstall/daemonset.yaml", &uninstall)
	c := uninstall.Spec.Template.Spec.Containers[0]
	out, err := exec.Command(filepath.Join(bins.Dir(t), "rampartd"), append(slices.Clone(c.Args), "--version")...).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "rampartd ") {
		t.Errorf("rampartd %v --version: %v\n%s", c.Args, err, out)
	}
	for _, want := range []string{"--uninstall", "--if-installed", "--idle"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("uninstall args %v lack %s", c.Args, want)
		}
	}
	mounts := func(ds *appsv1.DaemonSet) map[string]string { // container path -> host path
		host := map[string]string{}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				host[v.Name] = v.HostPath.Path
			}
		}
		m := map[string]string{}
		for _, vm := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
			m[vm.MountPath] = host[vm.Name]
		}
		return m
	}
	got := mounts(&uninstall)
	for path, host := range mounts(&agent) {
		if path == "/sys/fs/cgroup" {
			continue // the Service translation's, which the uninstall has nothing of
		}
		if got[path] != host {
			t.Errorf("the agent mounts host %s at %s; the uninstall %q", host, path, got[path])
		}
	}
}
