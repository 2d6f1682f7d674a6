package podrunner

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testWorker(policy corev1.RestartPolicy) *worker {
	r := &Runner{cfg: Config{RetryMax: 8 * time.Second, Address: netip.MustParseAddr("198.19.0.1")}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n1", RestartPolicy: policy, Containers: []corev1.Container{{
			Name: "c", Command: []string{"/bin/server"}, Args: []string{"--port", "80"},
		}}},
	}
	w := newWorker(r, pod.UID, pod, &sandbox{PodIP: "198.18.0.7"})
	w.pod = pod
	return w
}

// Exits follow the restart policy as the kubelet's: the phase a pod ends in, or a restart
// after a backoff that doubles up to RetryMax and starts over after a long run.
func TestRestartPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy   corev1.RestartPolicy
		code     int32
		terminal corev1.PodPhase
	}{
		{corev1.RestartPolicyNever, 0, corev1.PodSucceeded},
		{corev1.RestartPolicyNever, 3, corev1.PodFailed},
		{corev1.RestartPolicyOnFailure, 0, corev1.PodSucceeded},
		{corev1.RestartPolicyOnFailure, 3, ""},
		{corev1.RestartPolicyAlways, 0, ""},
		{corev1.RestartPolicyAlways, 3, ""},
		{"", 0, ""}, // the API server defaults to Always
	} {
		w := testWorker(tc.policy)
		now := time.Now()
		w.lastExit = &corev1.ContainerStateTerminated{ExitCode: tc.code}
		w.afterExit(now, 0)
		if w.terminal != tc.terminal {
			t.Errorf("%q exit %d: terminal %q, want %q", tc.policy, tc.code, w.terminal, tc.terminal)
		}
		if restarts := w.terminal == ""; restarts != (w.restartAt.Sub(now) == time.Second) {
			t.Errorf("%q exit %d: restart in %v", tc.policy, tc.code, w.restartAt.Sub(now))
		}
	}
	w := testWorker(corev1.RestartPolicyAlways)
	w.lastExit = &corev1.ContainerStateTerminated{ExitCode: 1}
	var got []time.Duration
	for _, ran := range []time.Duration{0, 0, 0, 0, 0, time.Minute} {
		now := time.Now()
		w.afterExit(now, ran)
		got = append(got, w.restartAt.Sub(now))
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, time.Second}; !slices.Equal(got, want) {
		t.Errorf("backoffs %v, want %v", got, want)
	}
}

// The process is command + args; the environment has PATH, HOSTNAME, literal values and
// the downward-API fields the runner knows; what it cannot run is refused with a reason.
func TestCommandOf(t *testing.T) {
	w := testWorker(corev1.RestartPolicyAlways)
	w.pod.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "A", Value: "1"},
		{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "HOST", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
	}
	argv, env, err := w.commandOf()
	if err != nil || !slices.Equal(argv, []string{"/bin/server", "--port", "80"}) {
		t.Fatalf("argv %v, %v", argv, err)
	}
	for _, kv := range []string{"HOSTNAME=web", "A=1", "IP=198.18.0.7", "NS=shop", "HOST=198.19.0.1"} {
		if !slices.Contains(env, kv) {
			t.Errorf("env %v lacks %s", env, kv)
		}
	}
	if !strings.HasPrefix(env[0], "PATH=") {
		t.Errorf("env %v: want PATH first", env)
	}

	for name, change := range map[string]func(p *corev1.Pod){
		"no command": func(p *corev1.Pod) { p.Spec.Containers[0].Command = nil },
		"two containers": func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Command: []string{"x"}})
		},
		"init container": func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "i"}} },
		"secret env": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}}}
		},
		"unknown field": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "L", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}
		},
	} {
		w := testWorker(corev1.RestartPolicyAlways)
		change(w.pod)
		if _, _, err := w.commandOf(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The pod's address is the IPv4 address on the interface inside the sandbox, not one on
// a host-side interface.
func TestResultAddr(t *testing.T) {
	host, pod := 0, 1
	res := &types100.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*types100.Interface{{Name: "rp1"}, {Name: "eth0", Sandbox: "/run/netns/x"}},
		IPs: []*types100.IPConfig{
			{Interface: &host, Address: net.IPNet{IP: net.IPv4(198, 18, 0, 1), Mask: net.CIDRMask(32, 32)}},
			{Interface: &pod, Address: net.IPNet{IP: net.IPv4(198, 18, 0, 9), Mask: net.CIDRMask(32, 32)}},
		},
	}
	if a, err := resultAddr(res); err != nil || a != netip.MustParseAddr("198.18.0.9") {
		t.Fatalf("resultAddr: %v, %v", a, err)
	}
	res.IPs = res.IPs[:1]
	if a, err := resultAddr(res); err == nil {
		t.Fatalf("resultAddr without a pod address: %v", a)
	}
}

// Status never says Ready without a network, and carries the network's failure.
func TestStatusWithoutNetwork(t *testing.T) {
	w := testWorker(corev1.RestartPolicyAlways)
	w.ready = true // as if a probe had passed: the network still decides
	w.netErr = errTest("CNI ADD: agent away")
	st := w.status()
	for _, c := range st.Conditions {
		switch c.Type {
		case corev1.PodReady, corev1.ContainersReady, corev1.PodReadyToStartContainers:
			if c.Status != corev1.ConditionFalse || c.Reason != "NetworkSetupFailed" || c.Message != "CNI ADD: agent away" {
				t.Errorf("condition %+v", c)
			}
		}
	}
	if st.PodIP != "" || st.Phase != corev1.PodPending {
		t.Errorf("podIP %q phase %s", st.PodIP, st.Phase)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// A process that cannot start leaves the pod Pending with the reason; one that ran and
// waits for its restart leaves it Running.
func TestStatusOfRestarts(t *testing.T) {
	w := testWorker(corev1.RestartPolicyAlways)
	w.netReady = true
	w.sb.PodIP = "198.18.0.7"
	w.lastExit = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: "starting /bin/server: no such file"}
	st := w.status()
	if st.Phase != corev1.PodPending || st.ContainerStatuses[0].State.Waiting == nil || !strings.Contains(st.ContainerStatuses[0].State.Waiting.Message, "no such file") {
		t.Errorf("never started: phase %s, state %+v", st.Phase, st.ContainerStatuses[0].State)
	}
	w.everRan = true
	w.lastExit = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}
	st = w.status()
	if cs := st.ContainerStatuses[0]; st.Phase != corev1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" || cs.LastTerminationState.Terminated == nil || cs.Ready {
		t.Errorf("restarting: phase %s, status %+v", st.Phase, cs)
	}
	if st.PodIP != "198.18.0.7" {
		t.Errorf("podIP %q", st.PodIP)
	}
}
