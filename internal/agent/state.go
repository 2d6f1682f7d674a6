package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

const (
	stateFileName = "state.json"
	stateVersion  = 1
)

// EndpointRecord is an endpoint as persisted. Records are never modified once they are in a
// model: changes replace them, so a model copy can share them.
type EndpointRecord struct {
	Namespace      string        `json:"namespace"`
	Name           string        `json:"name"`
	Labels         labels.Labels `json:"labels"`
	IP             netip.Addr    `json:"ip"`
	Ports          []PortRecord  `json:"ports,omitempty"`
	ServiceAccount string        `json:"serviceAccount,omitempty"`
	EpID           uint32        `json:"epID"`
	HostInterface  string        `json:"hostInterface"`
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

// stateFile is the JSON document in the state directory.
type stateFile struct {
	Version    int                      `json:"version"`
	Instance   string                   `json:"instance"`
	PodCIDR    netip.Prefix             `json:"podCIDR"`
	Namespaces map[string]labels.Labels `json:"namespaces"`
	Endpoints  []*EndpointRecord        `json:"endpoints"`
	Policies   []*PolicyRecord          `json:"policies"`
	NextRuleID uint32                   `json:"nextRuleID"`
	NextEpID   uint32                   `json:"nextEpID"`
	Identities json.RawMessage          `json:"identities"`
}

func statePath(dir string) string { return filepath.Join(dir, stateFileName) }

// loadState reads the state file; a missing file is an empty state.
func loadState(dir string) (*stateFile, error) {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return &stateFile{Version: stateVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("decoding state %s: %w", statePath(dir), err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state %s: version %d, want %d", statePath(dir), st.Version, stateVersion)
	}
	return &st, nil
}

// saveState writes the state atomically: a temporary file in the same directory, fsync,
// rename over the old file, fsync of the directory. A crash leaves the old or the new state,
// never a torn one.
func saveState(dir string, st *stateFile) error {
	sort.Slice(st.Endpoints, func(i, j int) bool { return st.Endpoints[i].Key() < st.Endpoints[j].Key() })
	sort.Slice(st.Policies, func(i, j int) bool { return st.Policies[i].Key() < st.Policies[j].Key() })
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	if err := writeFileAtomic(dir, stateFileName, append(b, '\n')); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return nil
}
