package nodetest

import (
	"encoding/json"
	"fmt"
)

// PodNetns returns the path of the network namespace of pod namespace/name's ready sandbox
// on the node, asked of the node's containerd through CRI (crictl inspectp): a test enters
// it to send a pod's traffic without going through kubectl exec and the kubelet, which the
// faults it injects may stop.
func (n *Node) PodNetns(crictl, namespace, name string) (string, error) {
	cri := []string{crictl, "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "--timeout", "5s"}
	out, err := n.Output(append(cri, "pods", "--state", "ready", "-o", "json")...)
	if err != nil {
		return "", fmt.Errorf("node %s: listing pods: %w", n.Name, err)
	}
	var list struct {
		Items []struct {
			ID       string
			Metadata struct{ Name, Namespace string }
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return "", fmt.Errorf("node %s: reading crictl pods: %w", n.Name, err)
	}
	var ids []string
	for _, p := range list.Items {
		if p.Metadata.Namespace == namespace && p.Metadata.Name == name {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("node %s: pod %s/%s has %d ready sandboxes, want 1", n.Name, namespace, name, len(ids))
	}
	out, err = n.Output(append(cri, "inspectp", ids[0])...)
	if err != nil {
		return "", fmt.Errorf("node %s: inspecting pod %s/%s: %w", n.Name, namespace, name, err)
	}
	var sandbox struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string }
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &sandbox); err != nil {
		return "", fmt.Errorf("node %s: pod %s/%s: reading crictl inspectp: %w", n.Name, namespace, name, err)
	}
	for _, ns := range sandbox.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path, nil
		}
	}
	return "", fmt.Errorf("node %s: pod %s/%s: its sandbox names no network namespace", n.Name, namespace, name)
}
