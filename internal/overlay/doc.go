// Package overlay manages the kernel side of the network between nodes: the node's
// collect_md ("external") VXLAN device, whose tunnel key the dataplane sets per packet
// (bpf/include/tunnel.h), and the routes to the other nodes' pod CIDRs, through that
// device (VXLAN) or through the fabric to the node's address (native routing, and IP-in-IP,
// whose outer header the dataplane adds and removes on the fabric interfaces that Fabric
// finds: bpf/include/ipip.h). It knows nothing of the node being a network namespace: it
// works in the namespace at the path it is given, the root one on a real host.
package overlay
