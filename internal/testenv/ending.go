package testenv

import (
	"fmt"
	"runtime"
	"testing"
)

// recorder is a testing.TB that records how a test ended. Its Skip and Fatalf end the
// calling goroutine, as the real ones do; everything else goes to the embedded TB.
type recorder struct {
	testing.TB
	ended string // "skip: msg", "fail: msg", or "went on"
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.ended = "skip: " + fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = "fail: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// Ending calls f on a goroutine of its own with a TB that records how f ended it, for the
// tests of test helpers that skip or fail: "skip: msg", "fail: msg", or "went on". Methods
// other than Skip, Fatalf and Helper go to t.
func Ending(t testing.TB, f func(testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
		r.ended = "went on"
	}()
	<-done
	return r.ended
}
