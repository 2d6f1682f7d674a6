package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rampartnet/rampart/internal/mapstate"
)

// IPCache is the ipcache map: the identity (and endpoint, tunnel peer) of each address
// and prefix.
type IPCache struct{ *handle }

// ApplyIPCache makes the ipcache map equal to desired: new and changed prefixes are written
// first, then prefixes no longer wanted are deleted, so an address never falls back to a
// shorter prefix (ultimately world) while its own entry is being replaced. An entry's
// EndpointID (the ep_id of a local endpoint's /32) lets a sender's veth evaluate that
// endpoint's ingress policy, which is how its L7 rules steer connections to the proxy.
func (d *IPCache) ApplyIPCache(desired map[netip.Prefix]mapstate.IPCacheEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()

	want := make(map[netip.Prefix]mapstate.IPCacheEntry, len(desired))
	for p, e := range desired {
		if !p.IsValid() {
			return fmt.Errorf("applying ipcache: invalid prefix %v", p)
		}
		want[canonicalPrefix(p)] = e
	}
	var remove []netip.Prefix
	for p := range d.ipcache {
		if _, ok := want[p]; !ok {
			remove = append(remove, p)
		}
	}
	if err := d.updateIPCache(want, remove); err != nil {
		return fmt.Errorf("applying ipcache: %w", err)
	}
	return nil
}

// UpdateIPCache is ApplyIPCache for a known difference: it writes the entries of upsert
// that differ from what the map holds, then deletes the prefixes of remove. Its cost
// follows the difference, not the size of the map.
func (d *IPCache) UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.updateIPCache(upsert, remove); err != nil {
		return fmt.Errorf("updating ipcache: %w", err)
	}
	return nil
}

// updateIPCache writes upsert's entries that differ from d.ipcache, then deletes remove's
// prefixes, each in one batch (batch.go); d.mu must be held. On failure d.ipcache holds
// what the kernel completed. Any change, even a partial one, bumps the ipcache generation
// afterwards (bumpIPCacheGeneration).
func (d *IPCache) updateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) (err error) {
	changed := false
	defer func() {
		if changed {
			err = errors.Join(err, d.bumpIPCacheGeneration())
		}
	}()
	var (
		prefixes []netip.Prefix
		entries  []mapstate.IPCacheEntry
		keys     []rampartIpcacheKey
		vals     []rampartIpcacheValue
	)
	for p, e := range upsert {
		if !p.IsValid() {
			return fmt.Errorf("invalid prefix %v", p)
		}
		p = canonicalPrefix(p)
		if cur, ok := d.ipcache[p]; ok && cur == e {
			continue
		}
		k, err := ipcacheKey(p)
		if err != nil {
			return err
		}
		v := rampartIpcacheValue{Identity: e.Identity, CidrIdentity: e.Secondary, EpId: e.EndpointID}
		if e.TunnelEndpoint.IsValid() {
			if !e.TunnelEndpoint.Is4() {
				return fmt.Errorf("writing %v: tunnel endpoint %v is not IPv4", p, e.TunnelEndpoint)
			}
			b := e.TunnelEndpoint.As4()
			v.TunnelEndpoint = binary.NativeEndian.Uint32(b[:])
		}
		prefixes, entries = append(prefixes, p), append(entries, e)
		keys, vals = append(keys, k), append(vals, v)
	}
	m := d.writer(d.objs.Ipcache)
	n, err := batchPut(m, keys, vals)
	changed = n > 0
	for i, p := range prefixes[:n] {
		d.ipcache[p] = entries[i]
	}
	if err != nil {
		return fmt.Errorf("writing %v: %w", prefixes[min(n, len(prefixes)-1)], err)
	}
	prefixes, keys = prefixes[:0], keys[:0]
	for _, p := range remove {
		if !p.IsValid() {
			return fmt.Errorf("invalid prefix %v", p)
		}
		p = canonicalPrefix(p)
		if _, ok := d.ipcache[p]; !ok {
			continue
		}
		k, err := ipcacheKey(p)
		if err != nil {
			return err
		}
		prefixes, keys = append(prefixes, p), append(keys, k)
	}
	n, err = batchDelete(m, keys)
	changed = changed || n > 0
	for _, p := range prefixes[:n] {
		delete(d.ipcache, p)
	}
	if err != nil {
		return fmt.Errorf("deleting %v: %w", prefixes[min(n, len(prefixes)-1)], err)
	}
	return nil
}

// InstalledIPCache returns the ipcache entries as last written (or read back on Open).
func (d *IPCache) InstalledIPCache() map[netip.Prefix]mapstate.IPCacheEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[netip.Prefix]mapstate.IPCacheEntry, len(d.ipcache))
	for p, e := range d.ipcache {
		out[p] = e
	}
	return out
}
