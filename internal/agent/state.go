package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/identity"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

// The state directory holds state.json (namespaces, policies, identities, counters) and
// one file per endpoint under endpoints/, so that an endpoint change writes one small file
// and not the whole node. Version 1 kept the endpoints in state.json; loadState still reads
// that, and the first save moves them into their own files.
const (
	stateFileName   = "state.json"
	stateVersion    = 2
	endpointDirName = "endpoints"
)

// EndpointRecord is an endpoint as persisted. Records are never modified once they are in a
// model: changes replace them, so a model copy can share them.
type EndpointRecord struct {
	Namespace      string        `json:"namespace"`
	Name           string        `json:"name"`
	Labels         labels.Labels `json:"labels"`
	IP             netip.Addr    `json:"ip"`
	IP6            netip.Addr    `json:"ip6,omitzero"` // dual stack: paired with IP (podaddr.Addrs), derived again at start
	Ports          []PortRecord  `json:"ports,omitempty"`
	ServiceAccount string        `json:"serviceAccount,omitempty"`
	EpID           uint32        `json:"epID"`
	HostInterface  string        `json:"hostInterface"`
	// CNI is set for an endpoint a CNI ADD made in a container runtime's namespace.
	CNI *CNIRecord `json:"cni,omitempty"`
	// Identity is the cluster-wide identity of its full label set (Kubernetes mode: the
	// cluster's allocator gave it), pinned in the agent's allocator; 0: allocated here.
	Identity identity.Identity `json:"identity,omitempty"`
	// Monitor: a monitor endpoint for tap contracts (internal/agent/taps), never tapped itself.
	Monitor bool `json:"monitor,omitempty"`
	// Audit: the endpoint is in audit mode (mapstate.Endpoint.Audit).
	Audit bool `json:"audit,omitempty"`
}

// CNIRecord is where a CNI endpoint lives: the runtime's namespace (never the agent's to
// delete) and the container and interface that key it.
type CNIRecord struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
}

func (c *CNIRecord) attachment() endpoint.Attachment {
	return endpoint.Attachment{NetnsPath: c.Netns, IfName: c.IfName}
}

// Key is "namespace/name".
func (e *EndpointRecord) Key() string { return e.Namespace + "/" + e.Name }

// PortRecord is a named port.
type PortRecord struct {
	Name     string `json:"name"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
}

// PolicyRecord is a policy as persisted: the document as read, where it came from, and the
// rule ids given to its rules (kept so ids stay stable across restarts and updates).
//
// Raw is compact JSON: the parser writes it so, and restore compacts what an older,
// indented state file held; so equal documents have equal bytes.
type PolicyRecord struct {
	Kind      policy.Kind     `json:"kind"`
	Namespace string          `json:"namespace,omitempty"`
	Name      string          `json:"name"`
	Source    string          `json:"source"`
	Raw       json.RawMessage `json:"raw"`
	RuleIDs   []uint32        `json:"ruleIDs"`
}

// Key matches policy.Policy.Key.
func (p *PolicyRecord) Key() string { return string(p.Kind) + "/" + p.Namespace + "/" + p.Name }

// AcceptedObjectRecord is the last version of a Kubernetes policy object (PolicyObject)
// the agent accepted, as persisted: the document the parser took and its
// resourceVersion. Document is a string, not raw JSON: the watcher hands over JSON, but
// the parser also takes YAML.
type AcceptedObjectRecord struct {
	Key             string `json:"key"`
	Kind            string `json:"kind"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
	Document        string `json:"document"`
}

// stateFile is the JSON document in the state directory. Endpoints is empty in the file
// (version 2) and filled by loadState from the endpoint files (and from a version 1 file).
type stateFile struct {
	Version    int                      `json:"version"`
	Instance   string                   `json:"instance"`
	PodCIDR    netip.Prefix             `json:"podCIDR"`
	PodCIDR6   netip.Prefix             `json:"podCIDR6,omitzero"` // zero: IPv4 only
	Namespaces map[string]labels.Labels `json:"namespaces"`
	// NodeLabels are the node's labels host policy selects by (model.nodeLabels): kept
	// so that a restarted agent in Kubernetes mode enforces host policy before its first
	// sync.
	NodeLabels labels.Labels           `json:"nodeLabels,omitempty"`
	Endpoints  []*EndpointRecord       `json:"endpoints,omitempty"`
	Policies   []*PolicyRecord         `json:"policies"`
	Nodes      []*NodeRecord           `json:"nodes,omitempty"`
	Remotes    []*RemoteEndpointRecord `json:"remoteEndpoints,omitempty"`
	Taps       []*TapRecord            `json:"taps,omitempty"`
	TapPolicy  *TapPolicyRecord        `json:"tapPolicy,omitempty"`
	Services   []*ServiceRecord        `json:"services,omitempty"`
	Accepted   []*AcceptedObjectRecord `json:"acceptedObjects,omitempty"`
	Quarantine []*QuarantineRecord     `json:"quarantine,omitempty"`
	FQDN       []fqdn.Entry            `json:"fqdn,omitempty"` // learnt names (dns.go)
	NextRuleID uint32                  `json:"nextRuleID"`
	Identities json.RawMessage         `json:"identities"`
	// NextEpID is the last field: save writes the file as the encoding without it
	// (which it compares) with the cursor put back at the end.
	NextEpID uint32 `json:"nextEpID"`

	fromFiles map[string]bool // endpoints loaded from their own files, by key
}

func statePath(dir string) string { return filepath.Join(dir, stateFileName) }

func endpointDir(dir string) string { return filepath.Join(dir, endpointDirName) }

// endpointFile is the file of endpoint namespace/name: namespaces are DNS labels and
// names DNS subdomains, so "_" cannot occur in either and the name is unambiguous.
func endpointFile(dir, namespace, name string) string {
	return filepath.Join(endpointDir(dir), namespace+"_"+name+".json")
}

// loadState reads the state: state.json (a missing file is an empty state) and the
// endpoint files. An endpoint in both a version 1 state.json and a file (a crash while
// the first save moved them) is taken from its file, the newer.
func loadState(dir string) (*stateFile, error) {
	st := &stateFile{Version: stateVersion}
	b, err := os.ReadFile(statePath(dir))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("reading state: %w", err)
	default:
		if err := json.Unmarshal(b, st); err != nil {
			return nil, fmt.Errorf("decoding state %s: %w", statePath(dir), err)
		}
		if st.Version != 1 && st.Version != stateVersion {
			return nil, fmt.Errorf("state %s: version %d, want 1 or %d", statePath(dir), st.Version, stateVersion)
		}
		if st.Version == stateVersion && len(st.Endpoints) > 0 {
			return nil, fmt.Errorf("state %s: version %d holds endpoints, which belong in %s", statePath(dir), st.Version, endpointDir(dir))
		}
	}
	files, err := loadEndpointFiles(dir)
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]*EndpointRecord, len(files)+len(st.Endpoints))
	for _, e := range st.Endpoints {
		byKey[e.Key()] = e
	}
	st.fromFiles = make(map[string]bool, len(files))
	for _, e := range files {
		byKey[e.Key()] = e
		st.fromFiles[e.Key()] = true
	}
	st.Endpoints = st.Endpoints[:0]
	for _, key := range sortedKeys(byKey) {
		e := byKey[key]
		st.Endpoints = append(st.Endpoints, e)
		// The cursor is saved with state.json, which an endpoint change alone does not
		// write: keep it past every stored endpoint's id.
		if e.EpID >= st.NextEpID {
			st.NextEpID = e.EpID + 1
		}
	}
	return st, nil
}

// loadEndpointFiles reads every endpoint file; leftover temporary files are removed.
func loadEndpointFiles(dir string) ([]*EndpointRecord, error) {
	ents, err := os.ReadDir(endpointDir(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading endpoint state: %w", err)
	}
	var out []*EndpointRecord
	for _, ent := range ents {
		path := filepath.Join(endpointDir(dir), ent.Name())
		if strings.HasPrefix(ent.Name(), ".tmp") {
			os.Remove(path) // a write cut short: the rename never happened
			continue
		}
		if !strings.HasSuffix(ent.Name(), ".json") {
			return nil, fmt.Errorf("endpoint state %s: not an endpoint file", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading endpoint state: %w", err)
		}
		var e EndpointRecord
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("decoding endpoint state %s: %w", path, err)
		}
		if endpointFile(dir, e.Namespace, e.Name) != path {
			return nil, fmt.Errorf("endpoint state %s: holds endpoint %s", path, e.Key())
		}
		out = append(out, &e)
	}
	return out, nil
}

// stateStore writes the state directory, each part only when it changed: the endpoint
// files of the endpoints whose record changed (records are replaced, never modified, so a
// pointer comparison finds them) and state.json when its bytes differ from the last
// written. A change of one endpoint so costs one file, whatever the node holds.
type stateStore struct {
	dir     string
	node    []byte                     // state.json as last written, without the ep id cursor
	written map[string]*EndpointRecord // endpoint files as last written (or read)
}

func newStateStore(dir string, loaded *stateFile) *stateStore {
	s := &stateStore{dir: dir, written: map[string]*EndpointRecord{}}
	for _, e := range loaded.Endpoints {
		if loaded.fromFiles[e.Key()] {
			s.written[e.Key()] = e
		}
	}
	return s
}

// save makes the directory hold st (its Endpoints are ignored) and eps. Every file is
// written atomically: a temporary file, fsync, rename over the old one; the directories
// are synced once at the end. A crash leaves each file old or new, never torn.
func (s *stateStore) save(st *stateFile, eps map[string]*EndpointRecord) error {
	st.Version = stateVersion
	st.Endpoints = nil
	sort.Slice(st.Policies, func(i, j int) bool { return st.Policies[i].Key() < st.Policies[j].Key() })
	// Compact, not indented: indenting re-indents every policy's raw document too, which
	// for a 10,000-rule policy cost more CPU than the kernel writes that enforce it
	// (docs/benchmarks.md, "Apply to enforcement").
	// The endpoint id cursor moves with every add; alone it is not worth a write of the
	// node's state: loadState puts it past every stored endpoint's id again.
	cursor := st.NextEpID
	st.NextEpID = 0
	cmp, err := json.Marshal(st)
	st.NextEpID = cursor
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	// The file is cmp with the cursor: its last field, so the encoding is not done twice
	// (it compacts every policy's raw document again, a large part of a large apply).
	var node []byte
	if zero := []byte(`,"nextEpID":0}`); bytes.HasSuffix(cmp, zero) {
		node = make([]byte, 0, len(cmp)+16)
		node = append(node, cmp[:len(cmp)-len(zero)]...)
		node = fmt.Appendf(node, `,"nextEpID":%d}`, cursor)
	} else if node, err = json.Marshal(st); err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	node = append(node, '\n')
	if err := os.MkdirAll(endpointDir(s.dir), 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	var epChanged bool
	written := make(map[string]*EndpointRecord, len(eps))
	for key, e := range eps {
		if s.written[key] == e {
			written[key] = e
			continue
		}
		b, err := json.MarshalIndent(e, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding endpoint %s: %w", key, err)
		}
		if err := writeFileAtomic(endpointFile(s.dir, e.Namespace, e.Name), append(b, '\n')); err != nil {
			return fmt.Errorf("writing endpoint state: %w", err)
		}
		written[key] = e
		epChanged = true
	}
	for key, e := range s.written {
		if _, ok := eps[key]; ok {
			continue
		}
		if err := os.Remove(endpointFile(s.dir, e.Namespace, e.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing endpoint state: %w", err)
		}
		epChanged = true
	}
	if epChanged {
		if err := syncDir(endpointDir(s.dir)); err != nil {
			return err
		}
	}
	s.written = written
	if !bytes.Equal(cmp, s.node) {
		if err := writeFileAtomic(statePath(s.dir), node); err != nil {
			return fmt.Errorf("writing state: %w", err)
		}
		if err := syncDir(s.dir); err != nil {
			return err
		}
		s.node = cmp
	}
	return nil
}

// writeFileAtomic replaces path with b: a temporary file in the same directory, fsync,
// rename. The caller syncs the directory.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
