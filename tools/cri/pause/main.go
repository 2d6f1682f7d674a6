// Command pause is the sandbox ("pause") container of the containerd test (test/containerd):
// the process that holds a pod sandbox's namespaces while the pod lives. It does what
// Kubernetes' pause does: as PID 1 of the sandbox it reaps the children it inherits, and it
// exits on SIGINT or SIGTERM, which is how the runtime stops a sandbox. It is built here
// (scripts/build-cri.sh) because no image registry is reachable to pull one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited: one SIGCHLD may stand for several.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
