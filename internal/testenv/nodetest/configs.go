package nodetest

import (
	"fmt"
	"net/netip"
)

// containerdConfig is the node's containerd configuration (version 3, containerd 2.x).
// Paths are the defaults, which the node's mount namespace makes its own. runc is the one
// scripts/build-node.sh built (with seccomp); the sandbox image is pinned so the kubelet's
// image garbage collection keeps it (no registry to pull it from again); the CRI plugin sets
// up each pod's lo itself rather than running the loopback plugin; a container's
// oom_score_adj is not lowered below containerd's own, which this host does not allow
// (no CAP_SYS_RESOURCE). NRI is off: nothing here uses it, and its socket is a fixed host
// path (/var/run/nri/nri.sock) that the containerds of two nodes, or of two labs, would
// take from each other.
func containerdConfig(runc, pauseImage string) string {
	return fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"
  use_internal_loopback = true

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = %q
  SystemdCgroup = false
`, pauseImage, runc)
}

// kubeletConfig is the node's KubeletConfiguration, fitted to this host (docs/cluster.md,
// "Real nodes"): cgroup v1 hybrid, so failCgroupV1 false and the cgroupfs driver (no
// systemd), a cgroupRoot of the node's own (two kubelets under one root kill each other's
// pods as strays), no eviction or image garbage collection (a test machine's disk is not a
// node's; the images came from no registry), and a kubelet API that the API server reaches
// without client certificates (anonymous, AlwaysAllow): only the lab's fabric reaches it.
// With a valid clusterDNS, pods get it as their nameserver (kube-dns's cluster IP).
func kubeletConfig(cgroupRoot string, clusterDNS netip.Addr) string {
	dns := ""
	if clusterDNS.IsValid() {
		dns = "clusterDNS: [" + clusterDNS.String() + "]\n"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
podLogsDir: /var/log/pods
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
  imagefs.inodesFree: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
clusterDomain: %s
%sresolvConf: /etc/resolv.conf
registerNode: true
`, cgroupRoot, ClusterDomain, dns)
}

// KubeProxyConfig is a node's kube-proxy configuration: nftables mode (the kernel has no
// IPVS; nf_tables NAT is built in), in the node's network namespace. It leaves the
// conntrack sysctls alone: the table size is the host's (read-only outside the initial
// namespace). Exported for the Service benchmark (bench/services), which measures against
// the kube-proxy the nodes run.
func KubeProxyConfig(kubeconfig, node, clusterCIDR string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %s
clusterCIDR: %s
clientConnection:
  kubeconfig: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, node, clusterCIDR, kubeconfig)
}

// cniConfList runs rampart-cni against the node's agent.
func cniConfList(socket string) string {
	return `{"cniVersion": "1.0.0", "name": "rampart",
  "plugins": [{"type": "rampart-cni", "socket": "` + socket + `"}]}
`
}
