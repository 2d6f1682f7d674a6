package testenv

import (
	"os"
	"syscall"
	"time"
)

// Terminate stops process p as a service manager does: SIGTERM, then SIGKILL if it has
// not ended within grace. done is closed when the process's Wait returned; Terminate
// returns once it is, and reports whether the process ended within grace.
func Terminate(p *os.Process, done <-chan struct{}, grace time.Duration) bool {
	p.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return true
	case <-time.After(grace):
		p.Kill()
		<-done
		return false
	}
}
