package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
)

// cidrSet is one CIDR set as the agent keeps it: what it is and its prefixes (sorted,
// distinct). A cidrSet is never modified once in a model; changes replace it.
type cidrSet struct {
	meta     cidrSetMeta
	prefixes *api.PrefixList
}

// cidrSetMeta is the part of a set file that is not prefixes.
type cidrSetMeta struct {
	Name      string           `json:"name"`
	Index     uint8            `json:"index"`
	Source    string           `json:"source"`
	LoadedAt  time.Time        `json:"loadedAt"`
	ChangedAt time.Time        `json:"changedAt"`
	LastLoad  *api.CIDRSetLoad `json:"lastLoad,omitempty"`
}

// agentBytes is the memory the set's prefixes take in the agent.
func (s *cidrSet) agentBytes() uint64 {
	return 8*uint64(len(s.prefixes.V4)) + 32*uint64(len(s.prefixes.V6))
}

// A set file, <state dir>/cidrsets/<name>.set, holds one set:
//
//	"RPCSET\x01\n"          8 bytes
//	metadata length          little-endian uint32
//	metadata                 JSON (cidrSetMeta)
//	prefixes                 api.PrefixList wire form (5 bytes per IPv4 prefix)
//
// It is written atomically (temporary file, fsync, rename, fsync of the directory), so a
// crash leaves the old or the new set. The files are the only record of the sets: a set
// exists if and only if its file does.
const (
	setFileMagic = "RPCSET\x01\n"
	setFileExt   = ".set"
	setDirName   = "cidrsets"
)

func setDir(stateDir string) string { return filepath.Join(stateDir, setDirName) }

func setFilePath(stateDir, name string) string {
	return filepath.Join(setDir(stateDir), name+setFileExt)
}

// writeSetFile stores a set atomically.
func writeSetFile(stateDir string, s *cidrSet) error {
	dir := setDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating CIDR set directory: %w", err)
	}
	meta, err := json.Marshal(s.meta)
	if err != nil {
		return fmt.Errorf("encoding CIDR set %s: %w", s.meta.Name, err)
	}
	f, err := os.CreateTemp(dir, s.meta.Name+setFileExt+".tmp*")
	if err != nil {
		return fmt.Errorf("creating CIDR set file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(setFileMagic)
	binary.Write(w, binary.LittleEndian, uint32(len(meta)))
	w.Write(meta)
	if _, err := s.prefixes.WriteTo(w); err != nil {
		f.Close()
		return fmt.Errorf("writing CIDR set %s: %w", s.meta.Name, err)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("writing CIDR set %s: %w", s.meta.Name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing CIDR set %s: %w", s.meta.Name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing CIDR set %s: %w", s.meta.Name, err)
	}
	if err := os.Rename(tmp, setFilePath(stateDir, s.meta.Name)); err != nil {
		return fmt.Errorf("replacing CIDR set %s: %w", s.meta.Name, err)
	}
	return syncDir(dir)
}

// removeSetFile deletes a set's file (a missing file is not an error).
func removeSetFile(stateDir, name string) error {
	if err := os.Remove(setFilePath(stateDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing CIDR set %s: %w", name, err)
	}
	return syncDir(setDir(stateDir))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// readSetFile reads one set file.
func readSetFile(path string) (*cidrSet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var magic [len(setFileMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil || string(magic[:]) != setFileMagic {
		return nil, fmt.Errorf("%s: not a CIDR set file", path)
	}
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil || n > 1<<20 {
		return nil, fmt.Errorf("%s: bad metadata length", path)
	}
	meta := make([]byte, n)
	if _, err := io.ReadFull(r, meta); err != nil {
		return nil, fmt.Errorf("%s: reading metadata: %w", path, err)
	}
	s := &cidrSet{}
	if err := json.Unmarshal(meta, &s.meta); err != nil {
		return nil, fmt.Errorf("%s: decoding metadata: %w", path, err)
	}
	l, err := api.ReadPrefixList(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if l.Normalize() != 0 {
		return nil, fmt.Errorf("%s: duplicate prefixes", path)
	}
	s.prefixes = &l
	return s, nil
}

// loadSetFiles reads every set of the state directory and checks that names match the
// files and indexes are distinct and in range. Leftover temporary files are removed. Any
// damage is an error: starting without a set that a deny policy names would open what the
// set blocks.
func loadSetFiles(stateDir string) (map[string]*cidrSet, error) {
	sets := map[string]*cidrSet{}
	entries, err := os.ReadDir(setDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return sets, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading CIDR sets: %w", err)
	}
	byIndex := map[uint8]string{}
	for _, e := range entries {
		path := filepath.Join(setDir(stateDir), e.Name())
		if strings.Contains(e.Name(), setFileExt+".tmp") {
			os.Remove(path) // a write that did not finish
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), setFileExt)
		if !ok || e.IsDir() {
			continue
		}
		s, err := readSetFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading CIDR sets: %w", err)
		}
		if s.meta.Name != name || !policy.ValidCIDRGroupName(name) {
			return nil, fmt.Errorf("reading CIDR sets: %s holds set %q", path, s.meta.Name)
		}
		if s.meta.Index >= maxCIDRSets {
			return nil, fmt.Errorf("reading CIDR sets: %s: index %d out of range", path, s.meta.Index)
		}
		if other, dup := byIndex[s.meta.Index]; dup {
			return nil, fmt.Errorf("reading CIDR sets: %s and %s share index %d", other, name, s.meta.Index)
		}
		byIndex[s.meta.Index] = name
		sets[name] = s
	}
	return sets, nil
}
