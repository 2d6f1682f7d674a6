package podrunner

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/rampartnet/rampart/internal/netns"
)

// worker owns one pod: its sandbox, process and status. Everything it holds is touched by
// its own goroutine only; update hands it the pod's latest version.
type worker struct {
	r   *Runner
	uid types.UID
	// orphan: a saved sandbox whose pod was gone when the runner started.
	orphan bool

	mu      sync.Mutex
	latest  *corev1.Pod
	gone    bool
	changed chan struct{}

	pod *corev1.Pod
	sb  *sandbox
	// adopted: sb came from disk; the network is checked, not assumed.
	adopted bool

	netReady   bool
	netErr     error
	netRetryAt time.Time
	netBackoff time.Duration

	proc *process
	// everRan: a process of the pod has run (the phase is Pending until then).
	everRan    bool
	lastExit   *corev1.ContainerStateTerminated
	restartAt  time.Time
	runBackoff time.Duration
	configErr  error
	terminal   corev1.PodPhase

	ready      bool
	probeAt    time.Time
	probeFails int32

	startTime  metav1.Time
	conditions map[corev1.PodConditionType]corev1.PodCondition
	reported   *corev1.PodStatus
	// reportFailed: the last status write failed (the API server away); retried on a
	// timer, since no event may come to wake the worker.
	reportFailed bool
}

func newWorker(r *Runner, uid types.UID, pod *corev1.Pod, sb *sandbox) *worker {
	w := &worker{
		r: r, uid: uid, latest: pod, gone: pod == nil, orphan: pod == nil,
		changed: make(chan struct{}, 1), sb: sb, adopted: sb != nil,
		startTime:  metav1.Now(),
		conditions: map[corev1.PodConditionType]corev1.PodCondition{},
	}
	if pod != nil {
		// What an earlier runner reported stays: start time, and the conditions'
		// transition times while their status holds.
		if pod.Status.StartTime != nil {
			w.startTime = *pod.Status.StartTime
		}
		for _, c := range pod.Status.Conditions {
			w.conditions[c.Type] = c
		}
	}
	w.changed <- struct{}{}
	return w
}

// update hands the worker the pod's latest version (nil: gone from the API).
func (w *worker) update(p *corev1.Pod) {
	w.mu.Lock()
	if p == nil {
		w.gone = true
	} else {
		w.latest = p
	}
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *worker) logf() []any {
	if w.pod != nil {
		return []any{"pod", w.pod.Namespace + "/" + w.pod.Name}
	}
	return []any{"pod", w.sb.PodNamespace + "/" + w.sb.PodName}
}

// run is the worker's loop: it brings the pod towards what its spec asks (a network, a
// running process) and reports each change, until the pod is deleted and cleaned up or
// ctx ends (the runner stops: the sandbox and process stay for the next runner).
func (w *worker) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		w.pod = w.latest
		gone := w.gone
		w.mu.Unlock()

		if gone || w.pod.DeletionTimestamp != nil {
			if w.terminate(ctx, !gone) {
				return
			}
		} else {
			w.step(ctx)
		}
		if ctx.Err() != nil {
			return
		}

		wake := w.nextWake()
		if gone || (w.pod != nil && w.pod.DeletionTimestamp != nil) {
			wake = time.Now().Add(time.Second) // a failed cleanup is retried
		}
		timer.Reset(time.Until(wake))
		var exited <-chan struct{}
		if w.proc != nil {
			exited = w.proc.done
		}
		select {
		case <-ctx.Done():
			return
		case <-w.changed:
		case <-exited:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

func (w *worker) nextWake() time.Time {
	wake := time.Now().Add(time.Hour)
	earliest := func(t time.Time) {
		if !t.IsZero() && t.Before(wake) {
			wake = t
		}
	}
	if !w.netReady {
		earliest(w.netRetryAt)
	}
	if w.proc == nil && w.terminal == "" {
		earliest(w.restartAt)
	}
	if w.proc != nil && readinessPort(w.pod) != nil {
		earliest(w.probeAt)
	}
	if w.reportFailed {
		earliest(time.Now().Add(2 * time.Second))
	}
	return wake
}

func (w *worker) backoff(cur time.Duration) time.Duration {
	if cur == 0 {
		return time.Second
	}
	return min(2*cur, w.r.cfg.RetryMax)
}

// step does the next thing the pod needs and reports its status.
func (w *worker) step(ctx context.Context) {
	now := time.Now()
	if w.sb == nil {
		id := newContainerID()
		w.sb = &sandbox{
			PodNamespace: w.pod.Namespace, PodName: w.pod.Name, PodUID: w.pod.UID,
			ContainerID: id, Netns: filepath.Join("/run/netns", "rp-pod-"+id[:12]),
		}
		if err := w.r.save(w.sb); err != nil {
			w.netErr = err
		}
	}
	if w.proc != nil && w.proc.exited() {
		w.exited(now)
	}
	if w.adopted {
		w.adopt(ctx)
		w.adopted = false
	}
	if !w.netReady && !now.Before(w.netRetryAt) {
		if err := w.setupNetwork(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			w.netErr = err
			w.netBackoff = w.backoff(w.netBackoff)
			w.netRetryAt = now.Add(w.netBackoff)
			w.r.log.Warn("pod network", append(w.logf(), "err", err, "retry", w.netBackoff)...)
		} else {
			w.netReady, w.netErr, w.netBackoff = true, nil, 0
		}
	}
	if w.netReady && w.proc == nil && w.terminal == "" && !now.Before(w.restartAt) {
		w.start(now)
	}
	if w.proc != nil {
		w.probe(ctx, now)
	} else {
		w.ready = false
	}
	w.report(ctx)
}

// adopt takes over a sandbox of an earlier runner: the process, if it still runs, and the
// network, if CNI CHECK passes (otherwise it is detached and attached again).
func (w *worker) adopt(ctx context.Context) {
	var before corev1.ContainerStatus
	if cs := w.pod.Status.ContainerStatuses; len(cs) == 1 {
		before = cs[0]
	}
	if before.LastTerminationState.Terminated != nil {
		w.lastExit = before.LastTerminationState.Terminated
	}
	if p, ok := adoptProcess(w.sb.PID, w.sb.PIDStart); ok {
		if before.State.Running != nil {
			p.started = before.State.Running.StartedAt.Time
		}
		w.proc, w.everRan = p, true
		w.r.log.Info("adopted process", append(w.logf(), "pid", p.pid)...)
	} else if w.sb.PID != 0 {
		w.sb.PID, w.sb.PIDStart, w.everRan = 0, 0, true
		// It ended while no runner watched: its exit code is lost.
		w.lastExit = &corev1.ContainerStateTerminated{ExitCode: -1, Reason: "Unknown", Message: "the process ended while the pod runner was not running", FinishedAt: metav1.Now()}
		w.afterExit(time.Now(), 0)
	}
	if p := w.pod; w.proc == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
		w.terminal = p.Status.Phase
		if before.State.Terminated != nil {
			w.lastExit = before.State.Terminated
		}
	}
	if !w.sb.Attached || !netnsExists(w.sb.Netns) {
		return
	}
	if err := w.r.cniCheck(ctx, w.sb); err != nil {
		w.r.log.Warn("adopted sandbox fails CHECK: attaching it again", append(w.logf(), "err", err)...)
		return
	}
	w.netReady = true
}

// setupNetwork makes the namespace and attaches it. An attachment that an earlier ADD
// may have left half made is detached first, as runtimes do before retrying.
func (w *worker) setupNetwork(ctx context.Context) error {
	if err := makeNetns(w.sb.Netns); err != nil {
		return err
	}
	if w.sb.Attached {
		if err := w.r.cniDel(ctx, w.sb); err != nil {
			return err
		}
		w.sb.Attached = false
		if err := w.r.save(w.sb); err != nil {
			return err
		}
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	addr, err := w.r.cniAdd(actx, w.sb)
	if err != nil {
		// A failed ADD may leave parts behind: the spec's answer is DEL.
		w.r.cniDel(ctx, w.sb)
		return err
	}
	w.sb.Attached, w.sb.PodIP = true, addr.String()
	return w.r.save(w.sb)
}

// start starts the pod's process, or records why it cannot.
func (w *worker) start(now time.Time) {
	argv, env, err := w.commandOf()
	if err != nil {
		w.configErr = err
		return
	}
	w.configErr = nil
	c := w.pod.Spec.Containers[0]
	p, err := startProcess(w.sb.Netns, argv, env, c.WorkingDir, LogPath(w.r.cfg.StateDir, w.pod.Namespace, w.pod.Name, w.pod.UID))
	if err != nil {
		w.lastExit = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), FinishedAt: metav1.Now()}
		w.afterExit(now, 0)
		return
	}
	if w.lastExit != nil {
		w.sb.Restarts++
	}
	w.proc, w.everRan = p, true
	w.sb.PID, w.sb.PIDStart = p.pid, p.start
	if err := w.r.save(w.sb); err != nil {
		w.r.log.Warn("saving sandbox", append(w.logf(), "err", err)...)
	}
	w.probeAt = now
	if rp := w.pod.Spec.Containers[0].ReadinessProbe; rp != nil {
		w.probeAt = now.Add(time.Duration(rp.InitialDelaySeconds) * time.Second)
	}
	w.probeFails = 0
}

// exited records the process's exit and what the restart policy makes of it.
func (w *worker) exited(now time.Time) {
	p := w.proc
	w.proc, w.ready = nil, false
	w.sb.PID, w.sb.PIDStart = 0, 0
	if err := w.r.save(w.sb); err != nil {
		w.r.log.Warn("saving sandbox", append(w.logf(), "err", err)...)
	}
	reason := "Completed"
	if p.code != 0 {
		reason = "Error"
	}
	w.lastExit = &corev1.ContainerStateTerminated{
		ExitCode: int32(p.code), Reason: reason,
		StartedAt: metav1.NewTime(p.started), FinishedAt: metav1.NewTime(now),
	}
	w.r.log.Info("process exited", append(w.logf(), "code", p.code)...)
	w.afterExit(now, now.Sub(p.started))
}

// afterExit applies the restart policy to lastExit: Always restarts, OnFailure restarts
// unless the exit code is 0, Never does not; restarts back off from 1 s, doubling up to
// RetryMax, and start over after a process that ran for 10 s.
func (w *worker) afterExit(now time.Time, ran time.Duration) {
	ok := w.lastExit.ExitCode == 0
	restart := false
	switch w.pod.Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
	case corev1.RestartPolicyOnFailure:
		restart = !ok
	default:
		restart = true
	}
	if !restart {
		w.terminal = corev1.PodFailed
		if ok {
			w.terminal = corev1.PodSucceeded
		}
		return
	}
	if ran >= 10*time.Second {
		w.runBackoff = 0
	}
	w.runBackoff = w.backoff(w.runBackoff)
	w.restartAt = now.Add(w.runBackoff)
}

// commandOf is the process to run for the pod's first container: command and args (there
// is no image to supply a default), and an environment of PATH, HOSTNAME and the
// container's env (literal values and the fields of the downward API the runner knows).
func (w *worker) commandOf() (argv, env []string, err error) {
	p := w.pod
	if len(p.Spec.Containers) != 1 || len(p.Spec.InitContainers) > 0 {
		return nil, nil, fmt.Errorf("the pod runner runs pods of one container and no init containers")
	}
	c := p.Spec.Containers[0]
	argv = append(append([]string{}, c.Command...), c.Args...)
	if len(c.Command) == 0 {
		return nil, nil, fmt.Errorf("container %s has no command (the pod runner has no images to take one from)", c.Name)
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	env = []string{"PATH=" + path, "HOSTNAME=" + p.Name}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			f := e.ValueFrom.FieldRef
			if f == nil {
				return nil, nil, fmt.Errorf("env %s: only fieldRef is supported in valueFrom", e.Name)
			}
			switch f.FieldPath {
			case "metadata.name":
				v = p.Name
			case "metadata.namespace":
				v = p.Namespace
			case "metadata.uid":
				v = string(p.UID)
			case "spec.nodeName":
				v = p.Spec.NodeName
			case "status.podIP":
				v = w.sb.PodIP
			case "status.hostIP":
				v = w.r.cfg.Address.String()
			default:
				return nil, nil, fmt.Errorf("env %s: field %s is not supported", e.Name, f.FieldPath)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return argv, env, nil
}

// readinessPort is the port of the first container's tcpSocket readiness probe, nil if it
// has none.
func readinessPort(p *corev1.Pod) *intstr.IntOrString {
	if p == nil || len(p.Spec.Containers) == 0 {
		return nil
	}
	rp := p.Spec.Containers[0].ReadinessProbe
	if rp == nil || rp.TCPSocket == nil {
		return nil
	}
	return &rp.TCPSocket.Port
}

// probe updates readiness: without a tcpSocket readiness probe the pod is ready once its
// process runs; with one, once a TCP connection to the pod's address and port succeeds
// from inside the pod's namespace, and no longer after failureThreshold failures in a row.
func (w *worker) probe(ctx context.Context, now time.Time) {
	port := readinessPort(w.pod)
	if port == nil {
		w.ready = true
		return
	}
	if now.Before(w.probeAt) {
		return
	}
	rp := w.pod.Spec.Containers[0].ReadinessProbe
	period := time.Duration(max(rp.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(rp.TimeoutSeconds, 1)) * time.Second
	w.probeAt = now.Add(period)
	err := w.dialProbe(ctx, *port, timeout)
	if err == nil {
		w.ready, w.probeFails = true, 0
		return
	}
	w.probeFails++
	if w.probeFails >= max(rp.FailureThreshold, 1) || !w.ready {
		w.ready = false
	}
}

func (w *worker) dialProbe(ctx context.Context, port intstr.IntOrString, timeout time.Duration) error {
	n := port.IntValue()
	if port.Type == intstr.String {
		n = 0
		for _, cp := range w.pod.Spec.Containers[0].Ports {
			if cp.Name == port.StrVal {
				n = int(cp.ContainerPort)
			}
		}
	}
	if n <= 0 || n > 65535 {
		return fmt.Errorf("readiness probe port %s: not a port of the container", port.String())
	}
	addr, err := netip.ParseAddr(w.sb.PodIP)
	if err != nil {
		return fmt.Errorf("pod address %q: %w", w.sb.PodIP, err)
	}
	var conn net.Conn
	if err := netns.Do(w.sb.Netns, func() error {
		var err error
		d := net.Dialer{Timeout: timeout}
		conn, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, uint16(n)).String())
		return err
	}); err != nil {
		return err
	}
	return conn.Close()
}

// terminate stops a pod the API server deletes (graceful: the object stays until the
// runner deletes it with grace 0) or that is gone already (deleted by force, or found
// gone at start): the process (SIGTERM, then SIGKILL after the grace period), the
// attachment (CNI DEL), the namespace, the state, and then the object. It reports whether
// all is done; otherwise the worker retries.
func (w *worker) terminate(ctx context.Context, deleteObject bool) bool {
	if w.sb != nil && w.adopted {
		if p, ok := adoptProcess(w.sb.PID, w.sb.PIDStart); ok {
			w.proc = p
		}
		w.adopted = false
	}
	if w.proc != nil {
		grace := 30 * time.Second
		if p := w.pod; p != nil {
			if p.DeletionGracePeriodSeconds != nil {
				grace = time.Duration(*p.DeletionGracePeriodSeconds) * time.Second
			} else if p.Spec.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
			}
		}
		if err := w.proc.stop(grace); err != nil {
			w.r.log.Warn("stopping pod process", append(w.logf(), "err", err)...)
			return false
		}
		w.proc = nil
	}
	if w.sb != nil {
		w.sb.PID, w.sb.PIDStart = 0, 0
		if err := w.r.cniDel(ctx, w.sb); err != nil {
			w.r.log.Warn("detaching pod", append(w.logf(), "err", err)...)
			if deleteObject {
				w.netErr, w.ready, w.netReady = err, false, false
				w.report(ctx)
			}
			return false
		}
		w.sb.Attached = false
		if err := removeNetns(w.sb.Netns); err != nil {
			w.r.log.Warn("removing pod namespace", append(w.logf(), "err", err)...)
			return false
		}
		if err := w.r.forget(w.sb); err != nil {
			w.r.log.Warn("forgetting pod", append(w.logf(), "err", err)...)
			return false
		}
		os.Remove(LogPath(w.r.cfg.StateDir, w.sb.PodNamespace, w.sb.PodName, w.sb.PodUID))
	}
	if deleteObject && w.pod != nil {
		uid := w.pod.UID
		err := w.r.cfg.Client.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			w.r.log.Warn("deleting pod", append(w.logf(), "err", err)...)
			return false
		}
	}
	w.r.log.Info("pod cleaned up", w.logf()...)
	return true
}

// report writes the pod's status if it changed since the last report.
func (w *worker) report(ctx context.Context) {
	st := w.status()
	if w.reported != nil && apiequality.Semantic.DeepEqual(st, *w.reported) {
		return
	}
	pods := w.r.cfg.Client.CoreV1().Pods(w.pod.Namespace)
	cur := w.pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := cur.DeepCopy()
		// Keep what the API server itself set (qosClass), overwrite the rest.
		qos := p.Status.QOSClass
		p.Status = *st.DeepCopy()
		p.Status.QOSClass = qos
		_, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := pods.Get(ctx, w.pod.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if fresh.UID != w.pod.UID {
				return nil // another pod of the same name: this one is gone
			}
			cur = fresh
		}
		return err
	})
	if err != nil {
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			w.r.log.Warn("reporting pod status", append(w.logf(), "err", err)...)
			w.reportFailed = true
		}
		return
	}
	w.reported, w.reportFailed = &st, false
}

// condition sets a condition, keeping its transition time while its status holds.
func (w *worker) condition(t corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
		reason, msg = "", ""
	}
	c, had := w.conditions[t]
	if !had || c.Status != status {
		c = corev1.PodCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()}
	}
	c.Reason, c.Message = reason, msg
	w.conditions[t] = c
	return c
}

// status is the pod's status as the worker knows it.
func (w *worker) status() corev1.PodStatus {
	p := w.pod
	c := p.Spec.Containers[0]
	host := w.r.cfg.Address.String()
	st := corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    host,
		HostIPs:   []corev1.HostIP{{IP: host}},
		StartTime: &w.startTime,
	}
	if w.netReady && w.sb.PodIP != "" {
		st.PodIP = w.sb.PodIP
		st.PodIPs = []corev1.PodIP{{IP: w.sb.PodIP}}
	}
	cs := corev1.ContainerStatus{
		Name: c.Name, Image: c.Image, ImageID: "",
		Ready: w.ready, RestartCount: w.sb.Restarts,
	}
	if w.lastExit != nil {
		cs.LastTerminationState.Terminated = w.lastExit
	}
	started := w.proc != nil
	cs.Started = &started
	switch {
	case w.proc != nil:
		cs.ContainerID = "rampart://" + w.sb.ContainerID + "-" + strconv.Itoa(int(w.sb.Restarts))
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(w.proc.started)}
		st.Phase = corev1.PodRunning
	case w.terminal != "":
		cs.State.Terminated = w.lastExit
		if cs.State.Terminated == nil {
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: -1, Reason: "Unknown"}
		}
		cs.LastTerminationState = corev1.ContainerState{}
		st.Phase = w.terminal
	case w.configErr != nil:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: w.configErr.Error()}
	case w.lastExit != nil:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: fmt.Sprintf("back-off restarting the process (exit code %d)", w.lastExit.ExitCode)}
		if w.lastExit.Reason == "StartError" {
			cs.State.Waiting.Message = w.lastExit.Message
		}
		if w.everRan {
			st.Phase = corev1.PodRunning
		}
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}

	netReason, netMsg := "", ""
	if w.netErr != nil {
		netReason, netMsg = "NetworkSetupFailed", w.netErr.Error()
	} else if !w.netReady {
		netReason, netMsg = "NetworkNotReady", "the pod's network is being set up"
	}
	notReady, notReadyMsg := "ContainersNotReady", "containers with unready status: ["+c.Name+"]"
	if !w.netReady {
		notReady, notReadyMsg = netReason, netMsg
	}
	if w.terminal != "" {
		notReady, notReadyMsg = "PodCompleted", ""
	}
	ready := w.ready && w.netReady
	st.Conditions = []corev1.PodCondition{
		w.condition(corev1.PodReadyToStartContainers, w.netReady, netReason, netMsg),
		w.condition(corev1.PodInitialized, true, "", ""),
		w.condition(corev1.ContainersReady, ready, notReady, notReadyMsg),
		w.condition(corev1.PodReady, ready, notReady, notReadyMsg),
		w.condition(corev1.PodScheduled, true, "", ""),
	}
	return st
}
