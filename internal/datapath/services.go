package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rampartnet/rampart/internal/service"
)

// Services is the socket-level Service translation (bpf/service.c, docs/services.md): its
// programs attached to one cgroup v2 directory, and the frontend -> backends maps they
// read. It holds what it wrote, so each change writes only what differs.
type Services struct {
	objs  serviceObjects
	links []link.Link

	mu      sync.Mutex
	lastRev uint32
	written map[service.Frontend]writtenService
}

type writtenService struct {
	rev      uint32
	backends []service.Backend
}

// DefaultServiceCgroup is the root of the host's cgroup v2 hierarchy: /sys/fs/cgroup on a
// unified host, /sys/fs/cgroup/unified on a hybrid one (v1 controllers beside it).
func DefaultServiceCgroup() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup"
	}
	return "/sys/fs/cgroup/unified"
}

// OpenServices loads the translation programs and attaches them to the cgroup v2
// directory cgroup (the root for every pod on the host; a directory of its own in tests)
// through BPF links, which let other programs, such as another agent's on the same host,
// stay attached beside them. The maps start empty: nothing is translated until Replace.
func OpenServices(cgroup string) (*Services, error) {
	return openServices(cgroup, 0)
}

// openServices is OpenServices with the backends map bounded by backendsMax (0: the
// object's default), so that tests can make a write fail.
func openServices(cgroup string, backendsMax uint32) (*Services, error) {
	s := &Services{written: map[service.Frontend]writtenService{}}
	spec, err := loadService()
	if err != nil {
		return nil, fmt.Errorf("loading service translation: %w", err)
	}
	if backendsMax > 0 {
		spec.Maps["svc_backends"].MaxEntries = backendsMax
		spec.Maps["svc_backends6"].MaxEntries = backendsMax
	}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading service translation: %+v", ve)
		}
		return nil, fmt.Errorf("loading service translation: %w", err)
	}
	for _, a := range []struct {
		p *ebpf.Program
		t ebpf.AttachType
	}{
		{s.objs.SvcConnect4, ebpf.AttachCGroupInet4Connect},
		{s.objs.SvcSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{s.objs.SvcRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{s.objs.SvcGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{s.objs.SvcConnect6, ebpf.AttachCGroupInet6Connect},
		{s.objs.SvcSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{s.objs.SvcRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{s.objs.SvcGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: a.t, Program: a.p})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("attaching %s to %s: %w", a.p, cgroup, err)
		}
		s.links = append(s.links, l)
	}
	return s, nil
}

// Close detaches the programs (translation stops: a connect to a Service address then
// goes to that address, which no pod has) and releases the maps.
func (s *Services) Close() error {
	var errs []error
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	s.links = nil
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

// Replace makes the maps translate exactly the table t: new and changed frontends are
// written, frontends not in t are removed. Each frontend's backend set changes at once
// (written under a new revision, then switched to). On an error the frontends it could
// not write refuse connections instead of keeping their old backends (whose addresses may
// belong to other pods by now); the tc programs judge policy on whatever address a packet
// carries after translation, so no error here can admit what policy denies.
func (s *Services) Replace(t service.Table) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for f, backends := range t {
		if w, ok := s.written[f]; ok && slices.Equal(w.backends, backends) {
			continue
		}
		if err := s.set(f, backends); err != nil {
			errs = append(errs, err)
		}
	}
	for f := range s.written {
		if _, ok := t[f]; ok {
			continue
		}
		if err := s.remove(f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Frontends returns how many frontends the maps translate.
func (s *Services) Frontends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.written)
}

// familyMaps are the frontend and backend maps of one address family.
type familyMaps struct{ services, backends *ebpf.Map }

// mapsOf returns the maps of f's family.
func (s *Services) mapsOf(f service.Frontend) familyMaps {
	if f.Addr.Is4() {
		return familyMaps{s.objs.SvcServices, s.objs.SvcBackends}
	}
	return familyMaps{s.objs.SvcServices6, s.objs.SvcBackends6}
}

// svcKey is f's key in its family's frontend map (serviceSvcKey or serviceSvcKey6).
func svcKey(f service.Frontend) (any, error) {
	switch {
	case f.Addr.Is4():
		a := f.Addr.As4()
		return serviceSvcKey{Ip4: binary.LittleEndian.Uint32(a[:]), Port: htons(f.Port), Proto: uint8(f.Protocol)}, nil
	case f.Addr.Is6() && !f.Addr.Is4In6():
		return serviceSvcKey6{Ip6: words6(f.Addr), Port: htons(f.Port), Proto: uint8(f.Protocol)}, nil
	}
	return nil, fmt.Errorf("service %s: want an IPv4 or IPv6 address", f)
}

// svcBackend is b's value in f's family's backend map: its address must be of f's family.
func svcBackend(f service.Frontend, b service.Backend) (any, error) {
	if b.Port == 0 || b.Addr.Is4() != f.Addr.Is4() || b.Addr.Is4In6() {
		return nil, fmt.Errorf("service %s: backend %s: want an address of the frontend's family and a port", f, b.Addr)
	}
	if b.Addr.Is4() {
		a := b.Addr.As4()
		return serviceSvcBackend{Ip4: binary.LittleEndian.Uint32(a[:]), Port: htons(b.Port)}, nil
	}
	return serviceSvcBackend6{Ip6: words6(b.Addr), Port: htons(b.Port)}, nil
}

// words6 is an IPv6 address as the four words the programs compare (network order in
// memory).
func words6(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// set writes f's backends under a new revision, switches f to it and deletes the old
// revision's backends.
func (s *Services) set(f service.Frontend, backends []service.Backend) error {
	key, err := svcKey(f)
	if err != nil {
		return err
	}
	m := s.mapsOf(f)
	old, had := s.written[f]
	s.lastRev++
	rev := s.lastRev
	for i, b := range backends {
		v, err := svcBackend(f, b)
		if err == nil {
			err = m.backends.Update(serviceSvcBackendKey{Rev: rev, Slot: uint32(i)}, v, ebpf.UpdateAny)
		}
		if err != nil {
			m.deleteBackends(rev, i)
			return errors.Join(fmt.Errorf("writing backends of service %s: %w", f, err), s.refuse(f, key, had, old))
		}
	}
	if err := m.services.Update(key, serviceSvcValue{Rev: rev, Count: uint32(len(backends))}, ebpf.UpdateAny); err != nil {
		m.deleteBackends(rev, len(backends))
		return errors.Join(fmt.Errorf("writing service %s: %w", f, err), s.refuse(f, key, had, old))
	}
	s.written[f] = writtenService{rev: rev, backends: slices.Clone(backends)}
	if had {
		m.deleteBackends(old.rev, len(old.backends))
	}
	return nil
}

// refuse makes f refuse connections after its new backends could not be written: its
// entry points to no backend, or, if even that write fails, it is deleted (no translation:
// the Service address belongs to no pod).
func (s *Services) refuse(f service.Frontend, key any, had bool, old writtenService) error {
	if !had {
		return nil // never translated: nothing stale to stop
	}
	m := s.mapsOf(f)
	err := m.services.Update(key, serviceSvcValue{Rev: old.rev, Count: 0}, ebpf.UpdateAny)
	if err != nil {
		if derr := m.services.Delete(key); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("stopping translation of service %s: %w", f, derr)
		}
		delete(s.written, f)
		m.deleteBackends(old.rev, len(old.backends))
		return nil
	}
	s.written[f] = writtenService{rev: old.rev, backends: []service.Backend{}}
	m.deleteBackends(old.rev, len(old.backends))
	return nil
}

func (s *Services) remove(f service.Frontend) error {
	key, err := svcKey(f)
	if err != nil {
		return err
	}
	m := s.mapsOf(f)
	if err := m.services.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting service %s: %w", f, err)
	}
	w := s.written[f]
	delete(s.written, f)
	m.deleteBackends(w.rev, len(w.backends))
	return nil
}

// deleteBackends removes slots 0..n-1 of rev; no entry points to them any more, so one
// left behind by an error only takes room.
func (m familyMaps) deleteBackends(rev uint32, n int) {
	for i := range n {
		_ = m.backends.Delete(serviceSvcBackendKey{Rev: rev, Slot: uint32(i)})
	}
}
