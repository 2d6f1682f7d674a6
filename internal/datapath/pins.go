package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/cilium/ebpf"
)

// Pins is the dataplane's pinned maps as a whole: the directory they are pinned in, the
// memory they take, and the maps other packages fill (internal/cidrtable,
// internal/sockverdict). Open migrates the pins earlier versions left (migrate.go).
type Pins struct{ *handle }

// PinDir returns the directory the maps are pinned in.
func (d *Pins) PinDir() string { return d.pinDir }

// SockPairsMap returns sv_pairs, the pairs of local endpoints whose new connections skip
// the proxy because the send-side verdict checks them (internal/sockverdict fills it).
func (d *Pins) SockPairsMap() *ebpf.Map { return d.objs.SvPairs }

// LinkPinDir is the pin directory's subdirectory that holds the TCX links (tcxPinDir).
const LinkPinDir = tcxPinDir

// tcxPinRE matches the name of a TCX link pin (tcxPin).
var tcxPinRE = regexp.MustCompile(`^[0-9]+-(ingress|egress)$`)

// PinNames returns the names of the pins a dataplane makes directly in its pin directory:
// every map the tc object pins by name (read from the object, so a map added to the C
// code is known here without a list to keep), the pins of earlier versions that Open
// migrates or removes, and extra: the pins of the objects that share the directory (the
// send-side verdict's, sockverdict.PinNames).
func PinNames(extra ...string) ([]string, error) {
	names := map[string]bool{legacyCountersPin: true, legacyCT4Pin: true, nsConntrackPin: true, jiffiesConntrackPin: true}
	for _, n := range append(legacyPins, extra...) {
		names[n] = true
	}
	spec, err := loadRampart()
	if err != nil {
		return nil, fmt.Errorf("reading the BPF object's pins: %w", err)
	}
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			names[name] = true
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// FindPins returns the paths of the dataplane's pins that exist in dir: the PinNames (with
// extra), and the TCX link pins in dir/LinkPinDir. Anything else in dir is not the
// dataplane's.
func FindPins(dir string, extra ...string) ([]string, error) {
	names, err := PinNames(extra...)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() {
			out = append(out, p)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("finding pins: %w", err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, LinkPinDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("finding link pins: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && tcxPinRE.MatchString(e.Name()) {
			out = append(out, filepath.Join(dir, LinkPinDir, e.Name()))
		}
	}
	return out, nil
}

// IsBPFFS reports whether path is on a bpf filesystem.
func IsBPFFS(path string) (bool, error) { return isBPFFS(path) }
