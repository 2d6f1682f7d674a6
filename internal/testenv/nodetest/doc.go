// Package nodetest starts a Kubernetes cluster of real nodes for a test: the control plane
// (k8stest: etcd and kube-apiserver, the API server on the host's address on the fabric), then
// kube-scheduler and kube-controller-manager on the host, and per node a network namespace
// on a bridged fabric (as clustertest's) and a mount namespace of its own, in which
// containerd (with runc) and kubelet run, and kube-proxy in nftables mode. The node's CNI
// is Rampart: one rampartd per node on the host in Kubernetes mode (clustertest.AddNode),
// and rampart-cni with a configuration list in the node's own /opt/cni/bin and
// /etc/cni/net.d. The binaries are scripts/build-node.sh's and scripts/build-cri.sh's.
// With Options.WithoutAgents no rampartd runs on the host: the test installs Rampart as
// users do, deploy/'s DaemonSet from the image (Options.Images), and the nodes are Ready
// once its agent pods have written the CNI configuration.
// With Options.DNS, CoreDNS (scripts/build-coredns.sh's image, coredns.yaml) is the cluster
// DNS behind the kube-dns Service at the slot's DNSServiceIP, the kubelets' clusterDNS.
//
// A node's mount namespace puts directories of the node's own over /var/lib/kubelet,
// /var/log/pods, /etc/cni/net.d, /opt/cni/bin, /run/containerd and /var/lib/containerd and
// a shared bpffs of its own over /sys/fs/bpf (with WithoutAgents also /run/rampart and
// /var/lib/rampart, where the agent pods' hostPath volumes point), so two kubelets on one host do not share the device
// plugin socket, state or CNI configuration. Everything else is the host's: /run/netns
// stays shared with the host, so the pod network namespaces containerd creates are where
// the host's rampartd opens them.
//
// Up to MaxSlots such clusters run on a host at once, each in a slot (Slot, SlotAt): a lock
// file, a fabric with the host's address on it, a pod range routed from the host, a service
// range and a DNS address of its own. A lab takes the first free slot, or waits for one;
// slot 0 is what labs had before there were slots, so a lab of older code, which knows
// only slot 0, never collides with a new one. Everything else a lab makes is named or
// placed for it alone (namespaces, links, cgroupRoot /rampart-<suffix>-<node>, pin
// directories, ports chosen free), or is shared and undone once: the sysctls the kubelet
// sets (kernel.panic and the others in Sysctls) and the mount points on the host are kept
// in a host record (/run/rampart-nodetest-host.json, under a lock of its own), where the
// first live lab records the sysctls and the last one restores them and removes the mount
// points. A lab whose process was killed counts as gone; its host link is removed by the
// next lab in its slot. Everything a lab made is undone when its test ends, also on
// failure.
package nodetest
