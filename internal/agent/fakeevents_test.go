package agent

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// fakeEvents is FlowEvents: the test sends events on events.
type fakeEvents struct {
	events  chan FlowEvent
	drained atomic.Uint64
	closed  <-chan struct{}
}

// fakeSendSide is SendSide: it records the last ApplySockPairs.
type fakeSendSide struct {
	mu        sync.Mutex
	sockPairs []SockPair // the last ApplySockPairs
	closed    <-chan struct{}
}

func (d *fakeSendSide) Programs() []*ebpf.Program { return nil }

// EventsDrained grows on every call: the fake's events reach the agent through a channel,
// with nothing left behind in a ring.
func (d *fakeEvents) EventsDrained() uint64 { return d.drained.Add(1) }

func (d *fakeEvents) ReadEvent() (FlowEvent, error) {
	select {
	case ev := <-d.events:
		return ev, nil
	case <-d.closed:
		return FlowEvent{}, errors.New("closed")
	}
}

func (d *fakeSendSide) ApplySockPairs(pairs []SockPair) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sockPairs = pairs
	return nil
}

func (d *fakeSendSide) ReadSockRequest() (proxy.AccessLog, error) {
	<-d.closed
	return proxy.AccessLog{}, errors.New("closed")
}

func (d *fakeSendSide) SockStatus() (sockverdict.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, p := range d.sockPairs {
		if p.Listed {
			n++
		}
	}
	return sockverdict.Status{Pairs: n}, nil
}
