package nodetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Sysctls are the host-wide kernel settings the kubelet sets at start
// (pkg/kubelet/cm's setupKernelTunables, with protectKernelDefaults false): they are not
// per network namespace, so a test's kubelet would change the host for good. The lab
// records them before the first kubelet and restores them after the last.
var Sysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// recordSysctls reads the current values of Sysctls.
func recordSysctls() (map[string]string, error) {
	vals := map[string]string{}
	for _, s := range Sysctls {
		b, err := os.ReadFile(sysctlPath(s))
		if err != nil {
			return nil, fmt.Errorf("reading sysctl %s: %w", s, err)
		}
		vals[s] = strings.TrimSpace(string(b))
	}
	return vals, nil
}

// restoreSysctls writes back what recordSysctls read.
func restoreSysctls(vals map[string]string) error {
	var errs []error
	for s, v := range vals {
		if err := os.WriteFile(sysctlPath(s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s to %s: %w", s, v, err))
		}
	}
	return errors.Join(errs...)
}
