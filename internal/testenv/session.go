package testenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
)

// Session is a testing.TB for a lab that outlives `go test`: scripts/cluster.sh holds a
// cluster of real nodes (internal/testenv/nodetest) for people in a process of its own,
// with the same code the tests start it with. What the lab registers with Cleanup runs
// when the session is closed, last registered first, as at the end of a test; Fatal and
// Skip end the calling goroutine, as they do in a test, so the lab must be started on a
// goroutine of its own (Run). Logs go to Out. Only the zero TB is embedded: a method this
// type does not define panics, which keeps a lab from relying on one quietly.
type Session struct {
	testing.TB
	name string
	out  io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	skipped  bool
	ctx      context.Context
	cancel   context.CancelFunc
}

// NewSession returns a session named name (its Name, which labs use in the names of what
// they make) that logs to out.
func NewSession(name string, out io.Writer) *Session {
	ctx, cancel := context.WithCancel(context.Background())
	return &Session{name: name, out: out, ctx: ctx, cancel: cancel}
}

// Run calls f on a goroutine of its own, as a test function runs, and reports whether f
// returned without failing, skipping or calling FailNow.
func (s *Session) Run(f func(testing.TB)) error {
	done := make(chan struct{})
	returned := false
	go func() {
		defer close(done)
		f(s)
		returned = true
	}()
	<-done
	switch {
	case s.Skipped():
		return fmt.Errorf("skipped: a component is missing (see the log above)")
	case s.Failed() || !returned:
		return fmt.Errorf("failed (see the log above)")
	}
	return nil
}

// Close runs the cleanups, last registered first, and reports whether any of them failed.
func (s *Session) Close() error {
	s.cancel()
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			break
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		// A cleanup that calls Fatal ends only itself, as in a test.
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		<-done
	}
	if s.Failed() {
		return fmt.Errorf("stopping failed (see the log above)")
	}
	return nil
}

func (s *Session) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *Session) Helper()      {}
func (s *Session) Name() string { return s.name }

func (s *Session) Log(args ...any) { fmt.Fprintln(s.out, args...) }
func (s *Session) Logf(format string, args ...any) {
	fmt.Fprintf(s.out, format+"\n", args...)
}

func (s *Session) Fail() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed = true
}

func (s *Session) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *Session) FailNow() { s.Fail(); runtime.Goexit() }

func (s *Session) Error(args ...any)                 { s.Log(args...); s.Fail() }
func (s *Session) Errorf(format string, args ...any) { s.Logf(format, args...); s.Fail() }
func (s *Session) Fatal(args ...any)                 { s.Log(args...); s.FailNow() }
func (s *Session) Fatalf(format string, args ...any) { s.Logf(format, args...); s.FailNow() }

func (s *Session) SkipNow() {
	s.mu.Lock()
	s.skipped = true
	s.mu.Unlock()
	runtime.Goexit()
}

func (s *Session) Skip(args ...any)                 { s.Log(args...); s.SkipNow() }
func (s *Session) Skipf(format string, args ...any) { s.Logf(format, args...); s.SkipNow() }

func (s *Session) Skipped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

// TempDir returns a new directory removed when the session closes.
func (s *Session) TempDir() string {
	dir, err := os.MkdirTemp("", s.name+"-")
	if err != nil {
		s.Fatalf("temporary directory: %v", err)
	}
	s.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Setenv sets an environment variable until the session closes.
func (s *Session) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	os.Setenv(key, value)
	s.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	})
}

// Context is cancelled when the session starts closing.
func (s *Session) Context() context.Context { return s.ctx }
func (s *Session) Output() io.Writer        { return s.out }
