package services

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/k8s/crds"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
)

// Namespace is the Kubernetes namespace of the benchmark's Services.
const Namespace = "svcbench"

// NodeName is the one Node: kube-proxy's hostnameOverride and rampartd's --node-name.
const NodeName = "svcbench-node"

// ServiceRange holds the benchmark's cluster IPs: a ServiceCIDR of its own (the API
// server's own range is a /24, too small for 10,000 Services), inside 198.18.0.0/15.
// The addresses are translated only in the benchmark's namespaces and cgroups.
var ServiceRange = netip.MustParsePrefix("198.19.128.0/18")

// Service ports: clients connect to ServicePort, the backend listens on BackendPort.
const (
	ServicePort = 80
	BackendPort = 8080
)

// ClusterIP is the address of Service i.
func ClusterIP(i int) netip.Addr {
	b := ServiceRange.Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// ServiceAddr is Service i's frontend, as a client dials it.
func ServiceAddr(i int) string {
	return netip.AddrPortFrom(ClusterIP(i), ServicePort).String()
}

// apiServer is the benchmark's control plane and a client of it.
type apiServer struct {
	cp   *controlplane.ControlPlane
	dir  string
	cs   kubernetes.Interface
	made int // Services written so far
}

// startAPI starts etcd and kube-apiserver listening on addr (the host's end of the link
// into kube-proxy's namespace), and writes what both Service implementations need before
// any Service: Rampart's CRDs, the namespace, the Node (with podCIDR for rampartd) and the
// ServiceCIDR of ServiceRange.
func startAPI(ctx context.Context, binDir string, addr netip.Addr, podCIDR netip.Prefix) (_ *apiServer, err error) {
	dir, err := os.MkdirTemp("", "rp-svcbench-k8s-")
	if err != nil {
		return nil, err
	}
	a := &apiServer{dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, a.Close())
		}
	}()
	a.cp, err = controlplane.Start(ctx, controlplane.Config{BinDir: binDir, Dir: dir, Address: addr})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", a.cp.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// Writing 20,000 objects: the client's default 5 requests/s would take an hour.
	rc.QPS, rc.Burst, rc.Timeout = 2000, 2000, 30*time.Second
	if a.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	if err := crds.Install(ctx, rc); err != nil {
		return nil, fmt.Errorf("installing the CRDs: %w", err)
	}
	if _, err := a.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	node, err := a.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName},
		Spec: corev1.NodeSpec{PodCIDR: podCIDR.String()}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", NodeName, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}
	if _, err := a.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("node %s status: %w", NodeName, err)
	}
	if _, err := a.cs.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "svcbench"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{ServiceRange.String()}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the ServiceCIDR %s: %w", ServiceRange, err)
	}
	return a, nil
}

// Close stops the control plane and removes its directory.
func (a *apiServer) Close() error {
	var errs []error
	if a.cp != nil {
		errs = append(errs, a.cp.Stop())
	}
	return errors.Join(append(errs, os.RemoveAll(a.dir))...)
}

// writers is how many API writes AddServices keeps in flight.
const writers = 16

// AddServices writes Services a.made .. n-1 with one EndpointSlice each (the backend,
// ready, on BackendPort), as the EndpointSlice controller would: both implementations read
// the same objects.
func (a *apiServer) AddServices(ctx context.Context, n int, backend netip.Addr) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range writers {
		wg.Go(func() {
			for i := range next {
				if err := a.addService(ctx, i, backend); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
				}
			}
		})
	}
	// The API server's allocator takes a new ServiceCIDR from its informer: until then a
	// cluster IP in it is refused. (Without kube-controller-manager nothing marks the
	// ServiceCIDR Ready; the allocator takes one with no condition as ready.)
	if a.made == 0 {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := a.addService(ctx, 0, backend)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || !apierrors.IsInvalid(errors.Unwrap(err)) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
		a.made = 1
	}
	for i := a.made; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	a.made = n
	return ctx.Err()
}

func (a *apiServer) addService(ctx context.Context, i int, backend netip.Addr) error {
	name := fmt.Sprintf("svc-%d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: ClusterIP(i).String(),
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: ServicePort,
				TargetPort: intstr.FromInt32(BackendPort)}},
		},
	}
	if _, err := a.cs.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service %s: %w", name, err)
	}
	ready := true
	port, proto := int32(BackendPort), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "svcbench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{backend.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
	if _, err := a.cs.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating endpointslice %s: %w", name, err)
	}
	return nil
}

// rssBytes is a process's resident set size (VmRSS).
func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// serviceMapBytes sums the kernel memory (memlock, as fdinfo reports it) of the Service
// translation's maps that process pid holds: those named svc_*.
func serviceMapBytes(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	seen := map[ebpf.MapID]bool{}
	var total int64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		var id, memlock int64 = -1, 0
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "map_id":
				id, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			case "memlock":
				memlock, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		if id < 0 || seen[ebpf.MapID(id)] {
			continue
		}
		seen[ebpf.MapID(id)] = true
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			continue
		}
		info, err := m.Info()
		m.Close()
		if err == nil && strings.HasPrefix(info.Name, "svc_") {
			total += memlock
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("process %d holds no svc_* map", pid)
	}
	return total, nil
}
