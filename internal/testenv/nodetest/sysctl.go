package nodetest

// Sysctls are the host-wide kernel settings the kubelet sets at start
// (pkg/kubelet/cm's setupKernelTunables, with protectKernelDefaults false): they are not
// per network namespace, so a test's kubelet would change the host for good. The first
// live lab on a host records them (host.acquire) and the last one to end restores them
// (lease.release): a lab that recorded them itself while another ran would record the
// other's kubelets' values.
var Sysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
}
