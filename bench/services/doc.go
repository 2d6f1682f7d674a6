// Package services is the Service benchmark (docs/benchmarks.md, "Services"): Rampart's
// socket-level eBPF Service translation against kube-proxy in nftables mode, both
// programmed from the same Services and EndpointSlices in a Kubernetes API server, and
// against no Service at all (a client connecting to the backend's address). It measures,
// side by side in one run, TCP connect latency to the Service address and the request rate
// over fresh connections, each as a ratio to direct-to-backend with an A/A control (direct
// against direct), at 1 and 10,000 Services, and the time each implementation takes from
// its start to the last Service answering, with its memory.
//
// Everything lives in namespaces, cgroups and an API server the run creates and removes.
package services
