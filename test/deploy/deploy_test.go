package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/k8s/identities"
	"github.com/rampartnet/rampart/internal/k8s/watcher"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// namespace is where deploy/ puts the agent (ServiceAccount, Role for the Lease, DaemonSet).
const namespace = "kube-system"

// budget bounds one run of the agent's Kubernetes side, with or without a rule: on a
// loaded 2-core machine a full sync takes a few seconds.
const budget = 45 * time.Second

func TestApplyAndRBAC(t *testing.T) {
	c := k8stest.Start(t, k8stest.WithAuthorization("RBAC"))
	dir := filepath.Join(testenv.ModuleRoot(t), "deploy")
	if out, err := c.Kubectl("apply", "-R", "-f", dir); err != nil {
		t.Fatalf("kubectl apply -R -f deploy/: %v\n%s", err, out)
	}
	if out, err := c.Kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"); err != nil {
		t.Fatalf("waiting for the CRDs: %v\n%s", err, out)
	}
	for _, obj := range []string{"serviceaccount/rampart", "configmap/rampart-config", "daemonset/rampart", "role/rampart", "rolebinding/rampart"} {
		if out, err := c.Kubectl("-n", namespace, "get", obj); err != nil {
			t.Errorf("after apply, %s: %v\n%s", obj, err, out)
		}
	}
	// Applying again changes nothing.
	if out, err := c.Kubectl("apply", "-R", "-f", dir); err != nil || strings.Contains(out, "configured") {
		t.Errorf("second apply: %v\n%s\nwant every object unchanged", err, out)
	}
	ctx := context.Background()
	ds, err := c.Client.AppsV1().DaemonSets(namespace).Get(ctx, "rampart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sa := ds.Spec.Template.Spec.ServiceAccountName; sa != "rampart" {
		t.Errorf("DaemonSet runs as %q, want the ServiceAccount rampart", sa)
	}
	role, err := c.Client.RbacV1().ClusterRoles().Get(ctx, "rampart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leaseRole, err := c.Client.RbacV1().Roles(namespace).Get(ctx, "rampart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if err := runAgentSide(t, c, "rampart"); err != nil {
		t.Fatalf("as the ServiceAccount of deploy/: %v", err)
	}

	// Each rule taken away in turn, from the ClusterRole or the Lease's Role, all at once
	// (a run without a needed list or watch fails only when its budget ends).
	n := len(role.Rules) + len(leaseRole.Rules)
	errs := make([]error, n)
	removed := make([]rbacv1.PolicyRule, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		cluster, lease := role.Rules, leaseRole.Rules
		if i < len(cluster) {
			removed[i] = cluster[i]
			cluster = append(append([]rbacv1.PolicyRule{}, cluster[:i]...), cluster[i+1:]...)
		} else {
			j := i - len(cluster)
			removed[i] = lease[j]
			lease = append(append([]rbacv1.PolicyRule{}, lease[:j]...), lease[j+1:]...)
		}
		sa := "rampart-" + testenv.Suffix(6)
		if err := grant(t, c, sa, cluster, lease); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = runAgentSide(t, c, sa)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var se setupError
		switch {
		case errors.As(err, &se):
			t.Errorf("without %v: %v", removed[i], err)
		case err == nil:
			t.Errorf("without the rule %v the agent still did all it does: the rule is not needed", removed[i])
		default:
			t.Logf("without %v: %v", removed[i], err)
		}
	}
}

// setupError is a failure to set a run up (as the admin), not of the run.
type setupError struct{ error }

// grant makes ServiceAccount sa in namespace with the given cluster-wide rules and the
// Lease rules in namespace, each in roles of its own (removed when the test ends).
func grant(t *testing.T, c *k8stest.Cluster, sa string, cluster, lease []rbacv1.PolicyRule) error {
	ctx := context.Background()
	rbac := c.Client.RbacV1()
	subj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: namespace}}
	t.Cleanup(func() {
		rbac.RoleBindings(namespace).Delete(ctx, sa, metav1.DeleteOptions{})
		rbac.Roles(namespace).Delete(ctx, sa, metav1.DeleteOptions{})
		rbac.ClusterRoleBindings().Delete(ctx, sa, metav1.DeleteOptions{})
		rbac.ClusterRoles().Delete(ctx, sa, metav1.DeleteOptions{})
		c.Client.CoreV1().ServiceAccounts(namespace).Delete(ctx, sa, metav1.DeleteOptions{})
	})
	if _, err := c.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: cluster}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sa}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := rbac.Roles(namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: lease}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := rbac.RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return nil
}

// refusingAgent stands for the agent: it records each view and refuses every policy object
// of its namespace (runs side by side each refuse their own), so that the watcher posts an Event and records the object's accepted version, and asks
// for an acknowledgement, which the watcher writes on the Node.
type refusingAgent struct {
	ns   string
	want string
	mu   sync.Mutex
	view *agent.ClusterView
}

func (a *refusingAgent) SyncCluster(_ context.Context, v agent.ClusterView) (agent.SyncResult, error) {
	a.mu.Lock()
	a.view = &v
	a.mu.Unlock()
	res := agent.SyncResult{Refused: map[string]string{}, WantAck: a.want}
	for key, o := range v.Objects {
		if o.Namespace != a.ns {
			continue
		}
		res.Refused[key] = "refused by the test"
		res.Record = append(res.Record, o)
	}
	return res, nil
}
func (a *refusingAgent) ReportSyncError(error) {}
func (a *refusingAgent) FailSync(error)        {}

// sees says whether the last view holds the policy object namespace/name.
func (a *refusingAgent) sees(namespace, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.view == nil {
		return false
	}
	for _, o := range a.view.Objects {
		if o.Namespace == namespace && o.Name == name {
			return true
		}
	}
	return false
}

var acceptedResource = schema.GroupVersionResource{Group: "rampart.io", Version: "v1alpha1", Resource: "acceptedpolicies"}

// runAgentSide runs what rampartd runs in Kubernetes mode (cmd/rampartd startWatcher: the
// identity allocator, the watcher, the identity collector) as ServiceAccount sa, for a
// Node, a namespace, a pod on the node and a NetworkPolicy of its own, and returns nil once
// everything it writes is written: the pod's identity (SecurityIdentity and claim), the
// node's RampartPolicySynced condition (nodes/status) and acknowledgement annotation
// (nodes), an Event on the refused policy and its AcceptedPolicy record, and the
// collector's Lease. Else the first thing missing when the budget ran out.
func runAgentSide(t *testing.T, c *k8stest.Cluster, sa string) error {
	sfx := testenv.Suffix(6)
	node, ns, leaseName := "node-"+sfx, "rp-"+sfx, "rampart-identity-collector-"+sfx
	admin := c.Client.CoreV1()
	ctx := context.Background()
	t.Cleanup(func() {
		admin.Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		admin.Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	n, err := admin.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: corev1.NodeSpec{PodCIDR: "198.18.7.0/24"}}, metav1.CreateOptions{})
	if err != nil {
		return setupError{err}
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.255.7"}}
	if _, err := admin.Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return setupError{err}
	}
	if _, err := admin.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return setupError{err}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: map[string]string{"app": sfx}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "rampart.io/none"}}}}
	if _, err := admin.Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return setupError{err}
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny", Namespace: ns}}
	if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return setupError{err}
	}

	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + sa}
	runCtx, cancel := context.WithTimeout(ctx, budget)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	quiet := func(string, ...any) {}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	ids, err := identities.NewAllocator(cfg, identities.Options{Logf: quiet})
	if err != nil {
		return err
	}
	if err := ids.Start(runCtx); err != nil {
		return fmt.Errorf("identity allocator: %w", err)
	}
	w, err := watcher.New(cfg, watcher.Options{NodeName: node, Allocator: ids, Coalesce: 10 * time.Millisecond, Logger: log})
	if err != nil {
		return err
	}
	w.Start(runCtx)
	a := &refusingAgent{ns: ns, want: "want-" + sfx}
	var leading sync.Once
	led := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); w.Run(runCtx, a) }()
	go func() {
		defer wg.Done()
		identities.RunCollector(runCtx, cfg, identities.CollectorOptions{Holder: node, InUse: w.InUse, Namespace: namespace, LeaseName: leaseName,
			Logf: quiet, OnLeading: func(l bool) {
				if l {
					leading.Do(func() { close(led) })
				}
			}})
	}()
	if _, err := w.WaitOwnNode(runCtx); err != nil {
		return err
	}
	info, err := w.LocalPod(runCtx, ns, "p")
	if err != nil {
		return fmt.Errorf("the pod's identity: %w", err)
	}

	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return setupError{err}
	}
	checks := []struct {
		what string
		ok   func() bool
	}{
		{"the identity's claim", func() bool {
			_, err := dyn.Resource(identities.ClaimResource).Get(ctx, identities.ClaimName(info.Identity), metav1.GetOptions{})
			return err == nil
		}},
		{"a sync with the policy in view", func() bool { return a.sees(ns, "deny") }},
		{"the RampartPolicySynced condition", func() bool {
			n, err := admin.Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == watcher.ConditionPolicySynced {
					return true
				}
			}
			return false
		}},
		{"the acknowledgement annotation", func() bool {
			n, err := admin.Nodes().Get(ctx, node, metav1.GetOptions{})
			return err == nil && n.Annotations[agent.PodsWantAnnotation] == a.want
		}},
		{"the PolicyRefused Event", func() bool {
			evs, err := admin.Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "PolicyRefused" && e.InvolvedObject.Name == "deny" && e.Source.Host == node {
					return true
				}
			}
			return false
		}},
		{"the AcceptedPolicy record", func() bool {
			l, err := dyn.Resource(acceptedResource).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, u := range l.Items {
				if got, _, _ := unstructured.NestedString(u.Object, "spec", "namespace"); got == ns {
					return true
				}
			}
			return false
		}},
		{"the collector's Lease", func() bool {
			select {
			case <-led:
				return true
			default:
				return false
			}
		}},
	}
	for _, ch := range checks {
		for !ch.ok() {
			select {
			case <-runCtx.Done():
				return errors.New("no " + ch.what + " within the budget")
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}
