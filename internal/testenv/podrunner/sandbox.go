package podrunner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rampartnet/rampart/internal/netns"
)

// podIfName is the pod's interface, as every Kubernetes runtime names it.
const podIfName = "eth0"

// sandbox is what the runner keeps of one pod on disk (state dir/sandboxes/<uid>.json), so
// that a restarted runner finds the namespaces, attachments and processes it made.
type sandbox struct {
	PodNamespace string    `json:"podNamespace"`
	PodName      string    `json:"podName"`
	PodUID       types.UID `json:"podUID"`
	// ContainerID is the sandbox's ID for CNI: one per sandbox, written before the first
	// ADD so that a crash between ADD and the next write still leaves a DEL possible.
	ContainerID string `json:"containerID"`
	// Netns is the path of the sandbox's network namespace (/run/netns/rp-pod-...).
	Netns string `json:"netns"`
	// Attached: the last ADD succeeded and no DEL followed.
	Attached bool `json:"attached"`
	// PodIP is the address of the last ADD's result.
	PodIP string `json:"podIP,omitempty"`
	// PID and PIDStart (the process's start time, /proc/PID/stat field 22) identify the
	// pod's running process, whose process group has the same ID; 0 when none runs.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pidStart,omitempty"`
	// Restarts counts the process's restarts.
	Restarts int32 `json:"restarts"`
}

func newContainerID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

func (r *Runner) sandboxDir() string { return filepath.Join(r.cfg.StateDir, "sandboxes") }

func (r *Runner) sandboxPath(uid types.UID) string {
	return filepath.Join(r.sandboxDir(), string(uid)+".json")
}

// LogPath is the file the process of pod namespace/name (uid) writes its stdout and
// stderr to, appended across restarts.
func LogPath(stateDir, namespace, name string, uid types.UID) string {
	return filepath.Join(stateDir, "logs", namespace+"_"+name+"_"+string(uid)+".log")
}

// save writes the sandbox's state atomically (temporary file, then rename).
func (r *Runner) save(sb *sandbox) error {
	data, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	path := r.sandboxPath(sb.PodUID)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("saving sandbox of %s/%s: %w", sb.PodNamespace, sb.PodName, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("saving sandbox of %s/%s: %w", sb.PodNamespace, sb.PodName, err)
	}
	return nil
}

func (r *Runner) forget(sb *sandbox) error {
	if err := os.Remove(r.sandboxPath(sb.PodUID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing sandbox state of %s/%s: %w", sb.PodNamespace, sb.PodName, err)
	}
	return nil
}

// loadSandboxes reads every saved sandbox, by pod UID.
func loadSandboxes(dir string) (map[types.UID]*sandbox, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading sandboxes: %w", err)
	}
	out := map[types.UID]*sandbox{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading sandbox %s: %w", e.Name(), err)
		}
		sb := &sandbox{}
		if err := json.Unmarshal(data, sb); err != nil || sb.PodUID == "" || sb.ContainerID == "" {
			return nil, fmt.Errorf("sandbox %s: not a sandbox state (%v)", e.Name(), err)
		}
		out[sb.PodUID] = sb
	}
	return out, nil
}

// makeNetns creates the sandbox's namespace if it does not exist and brings its loopback
// up, as runtimes do (a pod's processes talk to themselves on 127.0.0.1).
func makeNetns(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("creating network namespace %s: %w", path, err)
		}
		if err := netns.Create(path); err != nil {
			return err
		}
	}
	return netns.Do(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("loopback in %s: %w", path, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("loopback in %s up: %w", path, err)
		}
		return nil
	})
}

// removeNetns deletes the namespace's mount and file; a namespace already gone is fine.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing network namespace %s: %w", path, err)
	}
	return nil
}

// netnsExists reports whether path is a mounted network namespace (not just a file).
func netnsExists(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// networkConfig reads the first network configuration of the configuration directory in
// lexical order, as the kubelet's runtimes do, and on every call, so that a configuration
// written after the runner started is used.
func (r *Runner) networkConfig() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(r.cfg.CNIConfDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("reading CNI configuration directory %s: %w", r.cfg.CNIConfDir, err)
	}
	sort.Strings(files)
	for _, f := range files {
		if strings.HasSuffix(f, ".conflist") {
			list, err := libcni.ConfListFromFile(f)
			if err != nil {
				return nil, fmt.Errorf("loading %s: %w", f, err)
			}
			return list, nil
		}
		conf, err := libcni.ConfFromFile(f)
		if err != nil {
			return nil, fmt.Errorf("loading %s: %w", f, err)
		}
		list, err := libcni.ConfListFromConf(conf)
		if err != nil {
			return nil, fmt.Errorf("loading %s: %w", f, err)
		}
		return list, nil
	}
	return nil, fmt.Errorf("no CNI network configuration in %s", r.cfg.CNIConfDir)
}

func (sb *sandbox) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.ContainerID,
		NetNS:       sb.Netns,
		IfName:      podIfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", sb.PodNamespace},
			{"K8S_POD_NAME", sb.PodName},
			{"K8S_POD_INFRA_CONTAINER_ID", sb.ContainerID},
			{"K8S_POD_UID", string(sb.PodUID)},
		},
	}
}

// inNode runs fn in the node's network namespace (--node-netns), where a runtime on that
// node runs its plugins; in the runner's own namespace without one.
func (r *Runner) inNode(fn func() error) error {
	return netns.Do(r.nodeNetnsPath(), fn)
}

func (r *Runner) nodeNetnsPath() string {
	if r.cfg.NodeNetns == "" {
		return ""
	}
	return filepath.Join("/run/netns", r.cfg.NodeNetns)
}

// cniAdd attaches the sandbox and returns its IPv4 address from the result.
func (r *Runner) cniAdd(ctx context.Context, sb *sandbox) (netip.Addr, error) {
	list, err := r.networkConfig()
	if err != nil {
		return netip.Addr{}, err
	}
	var res cnitypes.Result
	r.gcMu.RLock()
	err = r.inNode(func() error {
		var err error
		res, err = r.cni.AddNetworkList(ctx, list, sb.runtimeConf())
		return err
	})
	r.gcMu.RUnlock()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("CNI ADD: %w", err)
	}
	return resultAddr(res)
}

// resultAddr is the IPv4 address the result puts on the pod's interface.
func resultAddr(res cnitypes.Result) (netip.Addr, error) {
	out, err := types100.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("CNI result: %w", err)
	}
	for _, ip := range out.IPs {
		if ip.Interface != nil && (*ip.Interface < 0 || *ip.Interface >= len(out.Interfaces) || out.Interfaces[*ip.Interface].Sandbox == "") {
			continue // an address on a host-side interface
		}
		if a, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("CNI result has no IPv4 address on the pod's interface: %s", out)
}

func (r *Runner) cniCheck(ctx context.Context, sb *sandbox) error {
	list, err := r.networkConfig()
	if err != nil {
		return err
	}
	if err := r.inNode(func() error { return r.cni.CheckNetworkList(ctx, list, sb.runtimeConf()) }); err != nil {
		return fmt.Errorf("CNI CHECK: %w", err)
	}
	return nil
}

func (r *Runner) cniDel(ctx context.Context, sb *sandbox) error {
	list, err := r.networkConfig()
	if err != nil {
		return err
	}
	if err := r.inNode(func() error { return r.cni.DelNetworkList(ctx, list, sb.runtimeConf()) }); err != nil {
		return fmt.Errorf("CNI DEL: %w", err)
	}
	return nil
}

// cniGC asks the plugins to remove every attachment but those of the sandboxes on disk.
// It holds gcMu so that no ADD runs meanwhile: an ADD's sandbox is on disk before the ADD
// starts, but the GC's list would be stale.
func (r *Runner) cniGC(ctx context.Context) error {
	list, err := r.networkConfig()
	if err != nil {
		return err
	}
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	sbs, err := loadSandboxes(r.sandboxDir())
	if err != nil {
		return err
	}
	var valid []cnitypes.GCAttachment
	for _, sb := range sbs {
		valid = append(valid, cnitypes.GCAttachment{ContainerID: sb.ContainerID, IfName: podIfName})
	}
	if err := r.inNode(func() error {
		return r.cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid})
	}); err != nil {
		return fmt.Errorf("CNI GC: %w", err)
	}
	return nil
}
