package agent

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// fakeEvents is FlowEvents: the test sends events on events.
type fakeEvents struct {
	events  chan flow.Event
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

// Drained grows on every call: the fake's events reach the agent through a channel,
// with nothing left behind in a ring.
func (d *fakeEvents) Drained() uint64 { return d.drained.Add(1) }

func (d *fakeEvents) Read() (flow.Event, error) {
	select {
	case ev := <-d.events:
		return ev, nil
	case <-d.closed:
		return flow.Event{}, errors.New("closed")
	}
}

func (d *fakeSendSide) ApplySockPairs(pairs []SockPair) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sockPairs = pairs
	return nil
}

func (d *fakeSendSide) ReadSockRequest() (flow.AccessLog, error) {
	<-d.closed
	return flow.AccessLog{}, errors.New("closed")
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
