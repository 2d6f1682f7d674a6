package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
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

// A set is stored in <state dir>/cidrsets/ as a base file and, after in-place changes, a
// journal:
//
//	NAME.set   "RPCSET\x02\n", generation (uint64), metadata length (uint32), metadata
//	           (JSON cidrSetMeta), the prefixes in api.PrefixList's wire form (5 bytes per
//	           IPv4 prefix). Written atomically: temporary file, fsync, rename, fsync of
//	           the directory, so a crash leaves the old or the new base.
//	NAME.log   "RPCLOG\x01\n", the generation of the base it continues, then one record
//	           per add or remove: length (uint32), CRC-32 (uint32) and a payload of the
//	           new metadata and the prefixes added and removed. Appended and fsynced.
//
// add and remove append a record of a few bytes instead of rewriting a base of 50 MB (ten
// million prefixes); a full load writes a new base (with a new generation) and then drops
// the journal. A journal whose generation is not its base's (a crash between the two
// steps) or whose last record is torn stops at that point: what was acknowledged is in the
// base and the complete records. The journal is folded into a new base when it grows past
// a few MiB, and when the agent starts. The files are the only record of the sets: a set
// exists if and only if its base does (all integers little-endian).
const (
	setFileMagic = "RPCSET\x02\n"
	setLogMagic  = "RPCLOG\x01\n"
	setFileExt   = ".set"
	setLogExt    = ".log"
	setDirName   = "cidrsets"
)

// setLogLimit is the journal size past which an in-place change writes a new base (a
// variable for tests).
var setLogLimit int64 = 4 << 20

func setDir(stateDir string) string { return filepath.Join(stateDir, setDirName) }

func setFilePath(stateDir, name string) string {
	return filepath.Join(setDir(stateDir), name+setFileExt)
}

func setLogPath(stateDir, name string) string {
	return filepath.Join(setDir(stateDir), name+setLogExt)
}

// setStore writes and removes set files, remembering each base's generation and journal
// size. Guarded by the agent's mu.
type setStore struct {
	stateDir string
	gen      map[string]uint64
	logBytes map[string]int64
}

func newSetStore(stateDir string) *setStore {
	return &setStore{stateDir: stateDir, gen: map[string]uint64{}, logBytes: map[string]int64{}}
}

// write stores a set's whole content as a new base and drops its journal.
func (st *setStore) write(s *cidrSet) error {
	dir := setDir(st.stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating CIDR set directory: %w", err)
	}
	meta, err := json.Marshal(s.meta)
	if err != nil {
		return fmt.Errorf("encoding CIDR set %s: %w", s.meta.Name, err)
	}
	gen := uint64(time.Now().UnixNano())
	if gen <= st.gen[s.meta.Name] {
		gen = st.gen[s.meta.Name] + 1
	}
	f, err := os.CreateTemp(dir, s.meta.Name+setFileExt+".tmp*")
	if err != nil {
		return fmt.Errorf("creating CIDR set file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	w := bufio.NewWriterSize(f, 1<<20)
	w.WriteString(setFileMagic)
	binary.Write(w, binary.LittleEndian, gen)
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
	if err := os.Rename(tmp, setFilePath(st.stateDir, s.meta.Name)); err != nil {
		return fmt.Errorf("replacing CIDR set %s: %w", s.meta.Name, err)
	}
	st.gen[s.meta.Name] = gen
	st.logBytes[s.meta.Name] = 0
	// The old journal continues the old generation: it is ignored from here on even if
	// removing it fails, but it should not linger.
	if err := os.Remove(setLogPath(st.stateDir, s.meta.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing CIDR set journal %s: %w", s.meta.Name, err)
	}
	return syncDir(dir)
}

// appendChange records an in-place change: s is the set's new content, added and removed
// what changed. A journal grown past setLogLimit is folded into a new base instead.
func (st *setStore) appendChange(s *cidrSet, added, removed *api.PrefixList) error {
	name := s.meta.Name
	gen, ok := st.gen[name]
	if !ok || st.logBytes[name] > setLogLimit {
		return st.write(s)
	}
	meta, err := json.Marshal(s.meta)
	if err != nil {
		return fmt.Errorf("encoding CIDR set %s: %w", name, err)
	}
	var payload bytes.Buffer
	binary.Write(&payload, binary.LittleEndian, uint32(len(meta)))
	payload.Write(meta)
	for _, l := range []*api.PrefixList{added, removed} {
		if _, err := l.WriteTo(&payload); err != nil {
			return err
		}
	}
	var rec bytes.Buffer
	path := setLogPath(st.stateDir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening CIDR set journal: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("opening CIDR set journal: %w", err)
	}
	created := fi.Size() == 0
	if created {
		rec.WriteString(setLogMagic)
		binary.Write(&rec, binary.LittleEndian, gen)
	}
	binary.Write(&rec, binary.LittleEndian, uint32(payload.Len()))
	binary.Write(&rec, binary.LittleEndian, crc32.ChecksumIEEE(payload.Bytes()))
	rec.Write(payload.Bytes())
	if _, err := f.Write(rec.Bytes()); err != nil {
		// A partial record fails its checksum when read; later records would follow it,
		// so the next change must start a new base.
		st.logBytes[name] = setLogLimit + 1
		return fmt.Errorf("writing CIDR set journal %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		st.logBytes[name] = setLogLimit + 1
		return fmt.Errorf("syncing CIDR set journal %s: %w", name, err)
	}
	st.logBytes[name] = fi.Size() + int64(rec.Len())
	if created {
		return syncDir(setDir(st.stateDir))
	}
	return nil
}

// remove deletes a set's files (missing files are not an error).
func (st *setStore) remove(name string) error {
	delete(st.gen, name)
	delete(st.logBytes, name)
	for _, p := range []string{setFilePath(st.stateDir, name), setLogPath(st.stateDir, name)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing CIDR set %s: %w", name, err)
		}
	}
	return syncDir(setDir(st.stateDir))
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

// readSetFile reads a base file; it returns the set and the base's generation.
func readSetFile(path string) (*cidrSet, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var magic [len(setFileMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil || string(magic[:]) != setFileMagic {
		return nil, 0, fmt.Errorf("%s: not a CIDR set file", path)
	}
	var hdr struct {
		Gen     uint64
		MetaLen uint32
	}
	if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil || hdr.MetaLen > 1<<20 {
		return nil, 0, fmt.Errorf("%s: bad header", path)
	}
	meta := make([]byte, hdr.MetaLen)
	if _, err := io.ReadFull(r, meta); err != nil {
		return nil, 0, fmt.Errorf("%s: reading metadata: %w", path, err)
	}
	s := &cidrSet{}
	if err := json.Unmarshal(meta, &s.meta); err != nil {
		return nil, 0, fmt.Errorf("%s: decoding metadata: %w", path, err)
	}
	l, err := api.ReadPrefixList(r)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if l.Normalize() != 0 {
		return nil, 0, fmt.Errorf("%s: duplicate prefixes", path)
	}
	s.prefixes = &l
	return s, hdr.Gen, nil
}

// replayLog applies the complete records of a set's journal that continue generation gen.
// It reports whether there were any.
func replayLog(path string, s *cidrSet, gen uint64) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) < len(setLogMagic)+8 || string(data[:len(setLogMagic)]) != setLogMagic ||
		binary.LittleEndian.Uint64(data[len(setLogMagic):]) != gen {
		return false, nil // another base's journal, or torn before its first record
	}
	data = data[len(setLogMagic)+8:]
	replayed := false
	for len(data) >= 8 {
		n, sum := binary.LittleEndian.Uint32(data), binary.LittleEndian.Uint32(data[4:])
		if uint64(len(data)-8) < uint64(n) || crc32.ChecksumIEEE(data[8:8+n]) != sum {
			break // torn: that change was never acknowledged
		}
		payload := data[8 : 8+n]
		data = data[8+n:]
		if len(payload) < 4 || uint64(len(payload)-4) < uint64(binary.LittleEndian.Uint32(payload)) {
			return false, fmt.Errorf("%s: bad record", path)
		}
		ml := binary.LittleEndian.Uint32(payload)
		var meta cidrSetMeta
		if err := json.Unmarshal(payload[4:4+ml], &meta); err != nil {
			return false, fmt.Errorf("%s: decoding record: %w", path, err)
		}
		r := bufio.NewReaderSize(bytes.NewReader(payload[4+ml:]), 1<<16)
		added, err := api.ReadPrefixList(r)
		if err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		removed, err := api.ReadPrefixList(r)
		if err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		added.Normalize()
		removed.Normalize()
		content := subtractLists(s.prefixes, &removed)
		content = mergeLists(content, &added)
		meta.Name, meta.Index = s.meta.Name, s.meta.Index
		s.meta, s.prefixes = meta, content
		replayed = true
	}
	return replayed, nil
}

// loadSetFiles reads every set of the state directory (bases and journals) and checks
// that names match the files and indexes are distinct and in range. Journals are folded
// into new bases, leftover temporary files removed. Any damage is an error: starting
// without a set that a deny policy names would open what the set blocks.
func loadSetFiles(st *setStore) (map[string]*cidrSet, error) {
	sets := map[string]*cidrSet{}
	dir := setDir(st.stateDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return sets, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading CIDR sets: %w", err)
	}
	byIndex := map[uint8]string{}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if strings.Contains(e.Name(), setFileExt+".tmp") {
			os.Remove(path) // a write that did not finish
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), setFileExt)
		if !ok || e.IsDir() {
			continue
		}
		s, gen, err := readSetFile(path)
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
		st.gen[name] = gen
		replayed, err := replayLog(setLogPath(st.stateDir, name), s, gen)
		if err != nil {
			return nil, fmt.Errorf("reading CIDR sets: %w", err)
		}
		if replayed {
			// A fresh base: appends then never follow a torn record.
			if err := st.write(s); err != nil {
				return nil, err
			}
		} else if err := os.Remove(setLogPath(st.stateDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale CIDR set journal: %w", err)
		}
		sets[name] = s
	}
	// Journals without a base belong to sets whose deletion was interrupted.
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), setLogExt); ok {
			if _, known := sets[name]; !known {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	return sets, nil
}
