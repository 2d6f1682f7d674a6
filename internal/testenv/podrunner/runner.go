package podrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// Config configures a Runner.
type Config struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// NodeName is the Node object the runner registers and the spec.nodeName of its pods.
	NodeName string
	// Address is the node's InternalIP.
	Address netip.Addr
	// PodCIDR is the node's spec.podCIDR. A Node that has another one already is an error
	// (the field cannot change).
	PodCIDR netip.Prefix
	// CNIConfDir holds the network configuration (the first .conf, .conflist or .json in
	// lexical order); CNIBinDirs the plugins.
	CNIConfDir string
	CNIBinDirs []string
	// StateDir holds the sandboxes' state, libcni's result cache (cni-cache) and the
	// pods' logs (logs/).
	StateDir string
	// NodeNetns names the node's network namespace (/run/netns/NAME), where the plugins
	// run, as they would on that node's host; "" runs them in the runner's namespace.
	NodeNetns string
	// Heartbeat is the interval of the Node's Ready condition updates (default 10 s).
	Heartbeat time.Duration
	// RetryMax caps the backoff of CNI ADD retries and process restarts (default 30 s;
	// the first retry comes after 1 s, then doubles).
	RetryMax time.Duration
	Logger   *slog.Logger
}

// Runner runs the pods of one node.
type Runner struct {
	cfg Config
	cni *libcni.CNIConfig
	log *slog.Logger

	// gcMu: ADDs hold it shared, GC exclusively (see cniGC).
	gcMu sync.RWMutex

	mu      sync.Mutex
	workers map[types.UID]*worker
	// saved are the sandboxes found on disk at start, not yet taken by a worker.
	saved map[types.UID]*sandbox
	wg    sync.WaitGroup
	ctx   context.Context
}

// New checks the configuration and prepares the state directory.
func New(cfg Config) (*Runner, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("no API client")
	case cfg.NodeName == "":
		return nil, errors.New("no node name")
	case !cfg.Address.IsValid():
		return nil, errors.New("no node address")
	case !cfg.PodCIDR.IsValid():
		return nil, errors.New("no pod CIDR")
	case cfg.CNIConfDir == "" || len(cfg.CNIBinDirs) == 0:
		return nil, errors.New("no CNI configuration or plugin directory")
	case cfg.StateDir == "":
		return nil, errors.New("no state directory")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.PodCIDR = cfg.PodCIDR.Masked()
	r := &Runner{
		cfg:     cfg,
		log:     cfg.Logger.With("node", cfg.NodeName),
		workers: map[types.UID]*worker{},
	}
	if err := os.MkdirAll(r.sandboxDir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	r.cni = newCNI(cfg)
	return r, nil
}

// newCNI is libcni with the result cache in the state directory. Its executor is given,
// not left to libcni, which makes its default on first use without a lock (a race between
// pods attached together).
func newCNI(cfg Config) *libcni.CNIConfig {
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDirs, filepath.Join(cfg.StateDir, "cni-cache"), exec)
}

// Run registers the node, re-adopts the sandboxes of an earlier run, and runs the node's
// pods until ctx ends. It leaves pods running when it returns: a later Run adopts them.
func (r *Runner) Run(ctx context.Context) error {
	// The API server may not answer yet (started together, or restarting): registration
	// is retried, except for a Node that cannot be this one.
	for backoff := time.Duration(0); ; {
		err := r.registerNode(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		var wrong *wrongNodeError
		if errors.As(err, &wrong) {
			return err
		}
		backoff = min(max(2*backoff, time.Second), r.cfg.RetryMax)
		r.log.Warn("registering node: retrying", "err", err, "retry", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
	}
	saved, err := loadSandboxes(r.sandboxDir())
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.saved, r.ctx = saved, ctx
	r.mu.Unlock()

	factory := informers.NewSharedInformerFactoryWithOptions(r.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", r.cfg.NodeName).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.podChanged(o) },
		UpdateFunc: func(_, o any) { r.podChanged(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				r.podGone(p.UID)
			}
		},
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	factory.Start(ctx.Done())
	defer func() {
		factory.Shutdown()
		r.wg.Wait()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended
	}
	r.log.Info("pods synced", "pods", len(inf.GetStore().ListKeys()))

	// Sandboxes whose pod is gone (deleted by force while the runner was down) are
	// cleaned up like pods deleted now; then the plugins collect what no sandbox names.
	r.mu.Lock()
	for uid, sb := range r.saved {
		if _, ok := r.workers[uid]; !ok {
			r.startWorker(uid, nil, sb)
		}
	}
	r.saved = nil
	r.mu.Unlock()
	go r.collectGarbage(ctx)

	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.heartbeat(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("node heartbeat", "err", err)
			}
		}
	}
}

// collectGarbage runs the plugins' GC once every orphan sandbox found at start is gone.
func (r *Runner) collectGarbage(ctx context.Context) {
	for {
		r.mu.Lock()
		orphans := 0
		for _, w := range r.workers {
			if w.orphan {
				orphans++
			}
		}
		r.mu.Unlock()
		if orphans == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := r.cniGC(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("garbage collection of CNI attachments", "err", err)
	}
}

func (r *Runner) podChanged(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok || p.Spec.NodeName != r.cfg.NodeName {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.workers[p.UID]; ok {
		w.update(p)
		return
	}
	sb := r.saved[p.UID]
	delete(r.saved, p.UID)
	r.startWorker(p.UID, p, sb)
}

func (r *Runner) podGone(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.workers[uid]; ok {
		w.update(nil)
	}
}

// startWorker starts the worker of a pod (pod nil: a saved sandbox whose pod is gone);
// r.mu must be held.
func (r *Runner) startWorker(uid types.UID, pod *corev1.Pod, sb *sandbox) {
	w := newWorker(r, uid, pod, sb)
	r.workers[uid] = w
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		w.run(r.ctx)
		r.mu.Lock()
		if r.workers[uid] == w {
			delete(r.workers, uid)
		}
		r.mu.Unlock()
	}()
}

// registerNode creates the Node or updates the runner's fields of an existing one (other
// fields, such as labels and annotations that agents write, are kept).
func (r *Runner) registerNode(ctx context.Context) error {
	nodes := r.cfg.Client.CoreV1().Nodes()
	cidr := r.cfg.PodCIDR.String()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, r.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			n = &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: r.cfg.NodeName, Labels: map[string]string{
					"kubernetes.io/hostname": r.cfg.NodeName,
					"kubernetes.io/os":       "linux",
				}},
				Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
			}
			n, err = nodes.Create(ctx, n, metav1.CreateOptions{})
			if err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if n.Spec.PodCIDR != "" && n.Spec.PodCIDR != cidr {
			return &wrongNodeError{fmt.Sprintf("node %s has pod CIDR %s, not %s (the field cannot change)", r.cfg.NodeName, n.Spec.PodCIDR, cidr)}
		}
		if n.Spec.PodCIDR == "" {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = cidr, []string{cidr}
			if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		r.setNodeStatus(n)
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("registering node %s: %w", r.cfg.NodeName, err)
	}
	return nil
}

// wrongNodeError: the Node exists with fields the runner cannot make its own.
type wrongNodeError struct{ msg string }

func (e *wrongNodeError) Error() string { return e.msg }

// setNodeStatus sets the node's addresses and a fresh Ready condition.
func (r *Runner) setNodeStatus(n *corev1.Node) {
	now := metav1.Now()
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: r.cfg.Address.String()},
		{Type: corev1.NodeHostName, Address: r.cfg.NodeName},
	}
	ready := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "rampart-podrunner is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
	}
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				ready.LastTransitionTime = c.LastTransitionTime
			}
			n.Status.Conditions[i] = ready
			return
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, ready)
}

// heartbeat refreshes the Node's Ready condition: registration again, which also brings
// back a Node deleted behind the runner's back.
func (r *Runner) heartbeat(ctx context.Context) error { return r.registerNode(ctx) }

// Cleanup removes every sandbox of the state directory without the API server: stops the
// processes, detaches them (CNI DEL) and deletes their namespaces and state, also when a
// DEL fails (reported in the error). Tests call it at the
// end, also after a failure; `rampart-podrunner --cleanup` runs it.
func Cleanup(cfg Config) error {
	if cfg.StateDir == "" || cfg.CNIConfDir == "" || len(cfg.CNIBinDirs) == 0 {
		return errors.New("cleanup needs the state, CNI configuration and plugin directories")
	}
	r := &Runner{cfg: cfg, cni: newCNI(cfg)}
	if _, err := os.Stat(r.sandboxDir()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	sbs, err := loadSandboxes(r.sandboxDir())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, sb := range sbs {
		if p, ok := adoptProcess(sb.PID, sb.PIDStart); ok {
			if err := p.stop(time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		// Everything goes even when DEL fails (the plugin gone, its agent gone): the
		// namespace's end takes the pod's side of any veth with it, and an agent drops
		// CNI endpoints whose namespace is gone.
		if err := r.cniDel(ctx, sb); err != nil {
			errs = append(errs, fmt.Errorf("sandbox of %s/%s: %w", sb.PodNamespace, sb.PodName, err))
		}
		if err := removeNetns(sb.Netns); err != nil {
			errs = append(errs, err)
		}
		if err := r.forget(sb); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
