package nodetest

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/rampartnet/rampart/internal/testenv/controlplane"
)

// The cluster DNS manifest parses into the objects CoreDNS needs, and they fit together
// and fit each slot's lab: the Service's fixed cluster IP is the slot's DNSServiceIP, inside
// its service range and the band for requested addresses there; it selects the Deployment's pods
// on DNS's ports; the pods run the given image with the Corefile answering for
// ClusterDomain and forwarding nowhere; they mount the service account token themselves;
// and the service account may list what the kubernetes plugin watches.
func TestCoreDNSManifest(t *testing.T) {
	for i := range MaxSlots {
		t.Run(fmt.Sprintf("slot%d", i), func(t *testing.T) { testCoreDNSManifest(t, SlotAt(lockDir, i)) })
	}
}

func testCoreDNSManifest(t *testing.T, slot Slot) {
	const image = "registry.k8s.io/coredns/coredns:v1.15.0"
	objs := map[string]runtime.Object{}
	for _, doc := range strings.Split(CoreDNSManifest(image, slot.DNSServiceIP), "\n---\n") {
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decoding %q: %v", doc, err)
		}
		objs[gvk.Kind] = obj
	}
	if len(objs) != 6 {
		t.Fatalf("%d kinds of object, want 6 (ServiceAccount, ClusterRole, ClusterRoleBinding, ConfigMap, Deployment, Service)", len(objs))
	}
	svc := objs["Service"].(*corev1.Service)
	dep := objs["Deployment"].(*appsv1.Deployment)
	cm := objs["ConfigMap"].(*corev1.ConfigMap)
	sa := objs["ServiceAccount"].(*corev1.ServiceAccount)
	role := objs["ClusterRole"].(*rbacv1.ClusterRole)
	binding := objs["ClusterRoleBinding"].(*rbacv1.ClusterRoleBinding)

	for _, o := range []interface{ GetNamespace() string }{svc, dep, cm, sa} {
		if o.GetNamespace() != "kube-system" {
			t.Errorf("%T in namespace %q, want kube-system", o, o.GetNamespace())
		}
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || ip != slot.DNSServiceIP {
		t.Errorf("kube-dns cluster IP %q (%v), want %v", svc.Spec.ClusterIP, err, slot.DNSServiceIP)
	}
	// The API server keeps the low sixteenth of a range (at least 16 addresses) for
	// Services that ask for an address.
	cidr := slot.ServiceCIDR
	if low := netip.PrefixFrom(cidr.Addr(), cidr.Bits()+4); !low.Contains(ip) || ip == controlplane.KubernetesServiceIP(cidr) {
		t.Errorf("kube-dns cluster IP %v outside %v (the requested band of %v) or the kubernetes Service's", ip, low, cidr)
	}
	if svc.Name != "kube-dns" {
		t.Errorf("Service %q, want kube-dns", svc.Name)
	}
	var dnsPorts []string
	for _, p := range svc.Spec.Ports {
		if p.Port == 53 && p.TargetPort.IntValue() == 53 {
			dnsPorts = append(dnsPorts, string(p.Protocol))
		}
	}
	if strings.Join(dnsPorts, ",") != "UDP,TCP" {
		t.Errorf("kube-dns port 53 protocols %v, want UDP and TCP", dnsPorts)
	}
	tmpl := dep.Spec.Template
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tmpl.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("kube-dns selector %v does not select the pods %v", svc.Spec.Selector, tmpl.Labels)
	}
	if tmpl.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("CoreDNS pods labelled %v, want k8s-app=kube-dns (what NetworkPolicies allowing DNS select)", tmpl.Labels)
	}
	if len(tmpl.Spec.Containers) != 1 || tmpl.Spec.Containers[0].Image != image {
		t.Fatalf("containers %+v, want one running %s", tmpl.Spec.Containers, image)
	}
	ctr := tmpl.Spec.Containers[0]
	if tmpl.Spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("CoreDNS dnsPolicy %q, want Default (not itself)", tmpl.Spec.DNSPolicy)
	}
	if tmpl.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as service account %q, the manifest's is %q", tmpl.Spec.ServiceAccountName, sa.Name)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if mounts["/var/run/secrets/kubernetes.io/serviceaccount"] == "" || mounts["/etc/coredns"] == "" {
		t.Errorf("mounts %v, want the service account token and the Corefile", mounts)
	}
	var token bool
	for _, v := range tmpl.Spec.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				token = token || s.ServiceAccountToken != nil
			}
		}
	}
	if !token {
		t.Error("no projected service account token volume")
	}
	if ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet == nil || ctr.ReadinessProbe.HTTPGet.Path != "/ready" {
		t.Errorf("readiness probe %+v, want the ready plugin's /ready", ctr.ReadinessProbe)
	}
	corefile := cm.Data["Corefile"]
	for _, want := range []string{"kubernetes " + ClusterDomain + " ", "ready\n"} {
		if !strings.Contains(corefile, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, corefile)
		}
	}
	if strings.Contains(corefile, "forward") {
		t.Errorf("Corefile forwards (nothing outside the lab answers):\n%s", corefile)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("binding %+v does not bind %s to %s/%s", binding, role.Name, sa.Namespace, sa.Name)
	}
	can := map[string]bool{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			can[res] = strings.Contains(strings.Join(r.Verbs, ","), "watch")
		}
	}
	for _, res := range []string{"services", "endpointslices", "namespaces", "pods"} {
		if !can[res] {
			t.Errorf("ClusterRole cannot watch %s", res)
		}
	}
}

// The kubelet configuration names the cluster DNS and domain only when given one.
func TestKubeletConfigDNS(t *testing.T) {
	for _, dns := range []netip.Addr{SlotAt(lockDir, 1).DNSServiceIP, {}} {
		var cfg struct {
			ClusterDNS    []string `yaml:"clusterDNS"`
			ClusterDomain string   `yaml:"clusterDomain"`
		}
		if err := yaml.Unmarshal([]byte(kubeletConfig("/r", dns)), &cfg); err != nil {
			t.Fatal(err)
		}
		want := []string(nil)
		if dns.IsValid() {
			want = []string{dns.String()}
		}
		if strings.Join(cfg.ClusterDNS, ",") != strings.Join(want, ",") || cfg.ClusterDomain != ClusterDomain {
			t.Errorf("with DNS %v: clusterDNS %v, clusterDomain %q; want %v, %s", dns, cfg.ClusterDNS, cfg.ClusterDomain, want, ClusterDomain)
		}
	}
}
