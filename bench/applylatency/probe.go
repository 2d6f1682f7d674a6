package applylatency

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Attempt is one TCP connection attempt of a prober: a new socket, so a new flow that the
// dataplane checks against the policy in force when its SYN leaves.
type Attempt struct {
	Start time.Time
	OK    bool // connected (false: no answer within the attempt timeout, or refused)
}

// prober opens a new TCP connection to one address every interval from inside a network
// namespace, with non-blocking sockets on one locked OS thread, so attempts overlap and
// the time resolution is the interval, not the attempt timeout.
type prober struct {
	nsPath   string
	dst      netip.AddrPort
	interval time.Duration
	timeout  time.Duration // an attempt unanswered for this long counts as dropped
	// last is when the latest attempt started (UnixNano), for the caller to wait until
	// the prober has tried after some moment: on a loaded machine its thread may not run
	// for tens of milliseconds.
	last atomic.Int64
}

type pending struct {
	fd    int
	start time.Time
}

// run probes until stop is closed, then lets the attempts in flight finish, and returns
// every attempt in start order.
func (p *prober) run(stop <-chan struct{}) ([]Attempt, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("prober: current network namespace: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromPath(p.nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("prober: opening %s: %w", p.nsPath, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("prober: entering %s: %w", p.nsPath, err)
	}
	defer func() {
		// A thread that cannot go back stays locked and ends with the goroutine.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()

	sa := &unix.SockaddrInet4{Port: int(p.dst.Port()), Addr: p.dst.Addr().As4()}
	var (
		out      []Attempt
		inflight []pending
		next     = time.Now()
		stopped  bool
	)
	finish := func(pd pending, ok bool) {
		if ok {
			// Reset rather than close: no TIME_WAIT, and the server sees the end at once.
			_ = unix.SetsockoptLinger(pd.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}
		unix.Close(pd.fd)
		out = append(out, Attempt{Start: pd.start, OK: ok})
	}
	defer func() {
		for _, pd := range inflight {
			unix.Close(pd.fd)
		}
	}()
	for {
		if !stopped {
			select {
			case <-stop:
				stopped = true
			default:
			}
		}
		if stopped && len(inflight) == 0 {
			break
		}
		now := time.Now()
		if !stopped && !now.Before(next) {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("prober: socket: %w", err)
			}
			pd := pending{fd: fd, start: time.Now()}
			p.last.Store(pd.start.UnixNano())
			switch err := unix.Connect(fd, sa); {
			case err == nil:
				finish(pd, true)
			case errors.Is(err, unix.EINPROGRESS):
				inflight = append(inflight, pd)
			default:
				finish(pd, false)
			}
			next = next.Add(p.interval)
			if next.Before(now) {
				next = now.Add(p.interval)
			}
		}
		// Attempts past their timeout were dropped.
		keep := inflight[:0]
		for _, pd := range inflight {
			if now.Sub(pd.start) >= p.timeout {
				finish(pd, false)
			} else {
				keep = append(keep, pd)
			}
		}
		inflight = keep
		wait := time.Until(next)
		if stopped || wait < 0 {
			wait = 0
		}
		if stopped {
			wait = p.interval
		}
		fds := make([]unix.PollFd, len(inflight))
		for i, pd := range inflight {
			fds[i] = unix.PollFd{Fd: int32(pd.fd), Events: unix.POLLOUT}
		}
		if _, err := unix.Poll(fds, max(int(wait/time.Millisecond), 0)); err != nil && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("prober: poll: %w", err)
		}
		keep = inflight[:0]
		for i, pd := range inflight {
			if fds[i].Revents == 0 {
				keep = append(keep, pd)
				continue
			}
			soErr, err := unix.GetsockoptInt(pd.fd, unix.SOL_SOCKET, unix.SO_ERROR)
			finish(pd, err == nil && soErr == 0)
		}
		inflight = keep
	}
	sortAttempts(out)
	return out, nil
}

func sortAttempts(a []Attempt) {
	// Attempts finish out of order; insertion sort is fine for the few thousand of a run.
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j].Start.Before(a[j-1].Start); j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// serve accepts and closes connections on port in the network namespace at nsPath until
// the returned listener is closed.
func serve(nsPath string, port int) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	// On a goroutine of its own: if its thread cannot leave the namespace, the goroutine
	// ends locked and the runtime retires the thread.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: fmt.Errorf("opening %s: %w", nsPath, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- result{err: fmt.Errorf("entering %s: %w", nsPath, err)}
			return
		}
		// The listening socket belongs to the namespace it was made in, whatever thread
		// accepts on it later.
		ln, err := net.Listen("tcp4", fmt.Sprintf(":%d", port))
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			err = fmt.Errorf("listening on %d in %s: %w", port, nsPath, err)
		}
		ch <- result{ln, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	go func() {
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return r.ln, nil
}
