package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/proxy"
)

// fakeNetwork records endpoints instead of creating namespaces.
type fakeNetwork struct {
	endpoint.Node
	mu      sync.Mutex
	eps     map[string]endpoint.Endpoint
	next    int
	failAdd bool
	// netnsDeleted lists the endpoints (ns/name) whose namespace Delete removed: never a
	// CNI endpoint's, which is the runtime's.
	netnsDeleted []string
}

func newFakeNetwork(instance string, cidr netip.Prefix) *fakeNetwork {
	return &fakeNetwork{Node: endpoint.Node{Instance: instance, PodCIDR: cidr}, eps: map[string]endpoint.Endpoint{}, next: 100}
}

// CreateMonitorLinks attaches "rx" and "tx" and makes nothing: the fake's endpoints have
// no interfaces.
func (f *fakeNetwork) CreateMonitorLinks(ep endpoint.Endpoint, attach func(rx, tx string) error) (endpoint.MonitorLinks, error) {
	if attach != nil {
		if err := attach("rx", "tx"); err != nil {
			return endpoint.MonitorLinks{}, err
		}
	}
	return endpoint.MonitorLinks{HostRx: "rx", HostTx: "tx"}, nil
}

func (f *fakeNetwork) DeleteMonitorLinks(namespace, name string) error { return nil }

func (f *fakeNetwork) SetMonitorInline(namespace, name string, inline bool) error { return nil }
func (f *fakeNetwork) MonitorReading(netnsPath string) (bool, error)              { return true, nil }

func (f *fakeNetwork) Setup() error    { return nil }
func (f *fakeNetwork) Teardown() error { return nil }
func (f *fakeNetwork) NetnsPath() string {
	return "/fake/node"
}

func (f *fakeNetwork) CreateAttached(ns, name string, ip netip.Addr, attach func(string) error) (endpoint.Endpoint, error) {
	ep, err := f.create(ns, name, ip)
	if err != nil || attach == nil {
		return ep, err
	}
	if err := attach(ep.HostIfName); err != nil {
		f.Delete(ns, name)
		return endpoint.Endpoint{}, err
	}
	return ep, nil
}

func (f *fakeNetwork) create(ns, name string, ip netip.Addr) (endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd {
		return endpoint.Endpoint{}, errors.New("injected create failure")
	}
	key := ns + "/" + name
	if _, ok := f.eps[key]; ok {
		return endpoint.Endpoint{}, fmt.Errorf("%s exists", key)
	}
	f.next++
	ep := endpoint.Endpoint{Namespace: ns, Name: name, IP: ip, HostIfName: f.HostIfName(ns, name), HostIfIndex: f.next}
	f.eps[key] = ep
	return ep, nil
}

func (f *fakeNetwork) Lookup(ns, name string, ip netip.Addr) (endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.eps[ns+"/"+name]
	if !ok {
		return ep, errors.New("missing")
	}
	return ep, nil
}

func (f *fakeNetwork) Delete(ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.eps, ns+"/"+name)
	f.netnsDeleted = append(f.netnsDeleted, ns+"/"+name)
	return nil
}

func (f *fakeNetwork) CreateIn(ns, name string, ip netip.Addr, at endpoint.Attachment, attach func(string) error) (endpoint.Endpoint, error) {
	ep, err := f.create(ns, name, ip)
	if err != nil {
		return ep, err
	}
	f.mu.Lock()
	ep.NetnsPath, ep.PodIfName, ep.PodMAC = at.NetnsPath, at.IfName, "02:00:00:00:00:01"
	f.eps[ns+"/"+name] = ep
	f.mu.Unlock()
	if attach != nil {
		if err := attach(ep.HostIfName); err != nil {
			f.DeleteLink(ns, name)
			return endpoint.Endpoint{}, err
		}
	}
	return ep, nil
}

func (f *fakeNetwork) LookupIn(ns, name string, ip netip.Addr, at endpoint.Attachment) (endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.eps[ns+"/"+name]
	if !ok || ep.NetnsPath != at.NetnsPath || ep.PodIfName != at.IfName || ep.IP != ip {
		return ep, errors.New("missing")
	}
	return ep, nil
}

func (f *fakeNetwork) DeleteLink(ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.eps, ns+"/"+name)
	return nil
}

func (f *fakeNetwork) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.eps)
}

type appliedEP struct {
	seq      int64
	epID     uint32
	redirect bool
}

// seq orders calls across the fakes.
var seq atomic.Int64

// fakeProxy records what the agent asks of the L7 proxy.
type fakeProxy struct {
	mu       sync.Mutex
	updates  []proxyUpdate
	started  int
	closed   bool
	failNext error // the next Update fails with it
}

type proxyUpdate struct {
	seq  int64
	plan *l7plan.Plan
}

func (p *fakeProxy) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started++
}

func (p *fakeProxy) Update(ctx context.Context, plan *l7plan.Plan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.updates = append(p.updates, proxyUpdate{seq: seq.Add(1), plan: plan})
	if err := p.failNext; err != nil {
		p.failNext = nil
		return err
	}
	return nil
}

func (p *fakeProxy) Status() proxy.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return proxy.Status{Running: p.started > 0, Connected: p.started > 0, PID: 4242, Version: uint64(len(p.updates)), AckedVersion: uint64(len(p.updates))}
}

func (p *fakeProxy) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *fakeProxy) last() proxyUpdate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.updates[len(p.updates)-1]
}

func (p *fakeProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.updates)
}
