// Package service is the agent's model of Kubernetes-style Services (docs/services.md):
// a Service's cluster address and ports, and the backend pods behind it, computed into the
// table the socket-level translation reads (frontend -> backends). It is pure: no kernel,
// BPF or Kubernetes client import. internal/datapath writes a Table into the BPF maps of
// bpf/service.c.
package service
