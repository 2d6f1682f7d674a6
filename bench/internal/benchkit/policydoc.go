package benchkit

import (
	"fmt"
	"io"
)

// NetworkPolicyHead writes the head of a Kubernetes NetworkPolicy manifest in YAML that the
// benchmarks' generated policies share: its name and namespace, and an ingress policy for
// the pods labelled app=app. The rules follow.
func NetworkPolicyHead(w io.Writer, name, namespace, app string) {
	fmt.Fprintf(w, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: %s
  namespace: %s
spec:
  podSelector:
    matchLabels:
      app: %s
  policyTypes: [Ingress]
`, name, namespace, app)
}

// CiliumPolicyHead is the head of a CiliumNetworkPolicy manifest in YAML that the
// benchmarks' generated policies share: its name and namespace, for the endpoints labelled
// app=app. The rules follow.
func CiliumPolicyHead(name, namespace, app string) string {
	return fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: %s
  namespace: %s
spec:
  endpointSelector:
    matchLabels:
      app: %s
`, name, namespace, app)
}
