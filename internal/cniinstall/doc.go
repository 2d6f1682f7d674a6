// Package cniinstall puts Rampart's CNI plugin on a node the way a container runtime finds
// it: the rampart-cni binary in the runtime's CNI binary directory and a network
// configuration list naming it in the configuration directory, each written to a temporary
// file in the same directory and renamed into place, so that the runtime never reads a
// half-written file. The configuration goes last: its appearance is what makes the runtime
// report the node's network ready, and by then the binary it names is in place. Uninstall
// removes both, the configuration first. It is the agent's (rampartd) installer, as
// Cilium's agent installs its plugin; it imports no other Rampart package.
package cniinstall
