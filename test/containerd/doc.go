// Package containerd runs the CNI plugin (cmd/rampart-cni) under a real container runtime:
// containerd from Debian with its CRI plugin, driven by crictl as the kubelet drives it, the
// sandbox image built from source and imported locally (scripts/build-cri.sh builds crictl,
// the CNI loopback plugin and that image). Each test starts a containerd of its own and a
// real agent. Needs root; with CI=true it fails instead of skipping when containerd or the
// tools are missing.
package containerd
