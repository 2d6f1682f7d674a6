package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/tap"
)

// API versions served for each kind.
const (
	apiNetworking = "networking.k8s.io/v1"
	apiCilium     = "cilium.io/v2"
	// apiCiliumAlpha serves CiliumCIDRGroup (as does apiCilium in newer Cilium releases).
	apiCiliumAlpha = "cilium.io/v2alpha1"
	// apiPolicyNetworking serves ClusterNetworkPolicy (network-policy-api v0.3.0).
	apiPolicyNetworking = "policy.networking.k8s.io/v1beta1"
)

// defaultNamespace is the namespace of a namespaced policy whose metadata names none, as
// kubectl does.
const defaultNamespace = "default"

// Documents is what a manifest stream holds: policies, CIDR groups and tap contracts, each
// in document order.
type Documents struct {
	Policies   []*Policy
	CIDRGroups []*CIDRGroup
	Taps       []*tap.Contract
}

// Parse parses every document of data, which was read from source (a file name, or "-"
// for stdin; it is used in messages, and a .json extension selects JSON).
//
// data is a YAML stream of one or more documents separated by "---", or JSON: a single
// manifest object, or a Cilium rule array (the `cilium policy import` format), which
// becomes one CiliumNetworkPolicy in namespace "default" named by its "name" rule label or
// else by the file name. Empty documents are skipped. Each policy manifest yields one
// Policy, each CiliumCIDRGroup one CIDRGroup.
//
// Parsing is strict and all-or-nothing: the first unknown, unsupported or invalid field in
// any document makes it return a *ParseError and nothing else; input over one of the
// limits of limits.go (size, documents, nesting) makes it return a *LimitError before
// that input is decoded. Other errors (reading input) are plain wrapped errors.
func Parse(source string, data []byte) (*Documents, error) {
	return parseAll(source, data, true)
}

// ParseDocuments is Parse for callers that only take policies: a CiliumCIDRGroup, a
// TapContract or a TrafficControl document is an error (a *ParseError naming it).
func ParseDocuments(source string, data []byte) ([]*Policy, error) {
	docs, err := parseAll(source, data, false)
	if err != nil {
		return nil, err
	}
	return docs.Policies, nil
}

// bom is a UTF-8 byte order mark, which some editors write first.
var bom = []byte("\xef\xbb\xbf")

func parseAll(source string, data []byte, groups bool) (*Documents, error) {
	data = bytes.TrimPrefix(data, bom)
	out := &Documents{}
	err := readDocuments(source, data, func(doc int, n *yaml.Node, raw []byte) error {
		d := &docParser{source: source, doc: doc, groups: groups, root: n, rootJSON: raw}
		return d.document(n, out)
	})
	var se *syntaxError
	var pe *ParseError
	var le *LimitError
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &se):
		return nil, &ParseError{Source: source, Document: se.doc, Line: se.line, Reason: se.reason}
	case errors.As(err, &pe):
		return nil, pe
	case errors.As(err, &le):
		return nil, le
	}
	return nil, fmt.Errorf("reading %s: %w", source, err)
}

// ParsePath parses a file, every *.yaml, *.yml and *.json file under a directory
// (recursively, in lexical order), or stdin when path is "-".
func ParsePath(path string) ([]*Policy, error) {
	if path == "-" {
		// One byte past the limit is enough for Parse to refuse it.
		data, err := io.ReadAll(io.LimitReader(os.Stdin, MaxManifestBytes+1))
		if err != nil {
			return nil, fmt.Errorf("reading stdin: %w", err)
		}
		return ParseDocuments("-", data)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading policy: %w", err)
	}
	if !fi.IsDir() {
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		return ParseDocuments(path, data)
	}
	files, err := manifestFiles(path)
	if err != nil {
		return nil, err
	}
	var out []*Policy
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, err
		}
		ps, err := ParseDocuments(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	return out, nil
}

// readFile reads a manifest file, refusing one over MaxManifestBytes before reading it.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading policy: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > MaxManifestBytes {
		return nil, &LimitError{Source: path, Limit: LimitSize, Value: fi.Size(), Max: MaxManifestBytes}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading policy: %w", err)
	}
	return data, nil
}

// manifestFiles lists the manifest files under dir, sorted by path.
func manifestFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() {
			return nil
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		if de.Type()&fs.ModeSymlink != 0 {
			// A link to a file is a file the user put there; a link to a directory is not
			// followed (it could loop).
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if fi.IsDir() {
				return nil
			}
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing policies in %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// document parses one non-empty document into out.
func (d *docParser) document(n *yaml.Node, out *Documents) error {
	switch n.Kind {
	case yaml.MappingNode:
		p, g, c, err := d.manifest(n)
		switch {
		case err != nil:
			return err
		case g != nil:
			out.CIDRGroups = append(out.CIDRGroups, g)
		case c != nil:
			out.Taps = append(out.Taps, c)
		default:
			out.Policies = append(out.Policies, p)
		}
		return nil
	case yaml.SequenceNode:
		p, err := d.ruleArray(n)
		if err != nil {
			return err
		}
		out.Policies = append(out.Policies, p)
		return nil
	case yaml.AliasNode:
		return d.noAlias(n, "")
	}
	return d.fail(n, "", "a document must be a policy manifest (a mapping) or a list of Cilium rules, not %s", describe(n))
}

func (d *docParser) sourceName() string {
	return fmt.Sprintf("%s: document %d", d.source, d.doc)
}

// manifest parses a document with apiVersion, kind, metadata and a spec: a policy, a CIDR
// group or a tap contract.
func (d *docParser) manifest(n *yaml.Node) (*Policy, *CIDRGroup, *tap.Contract, error) {
	d.learnName(n)
	entries, err := d.mapping(n, "")
	if err != nil {
		return nil, nil, nil, err
	}
	metaE, err := d.header(n, entries)
	if err != nil {
		return nil, nil, nil, err
	}
	switch d.kind {
	case KindCiliumCIDRGroup:
		g, err := d.cidrGroup(n, entries)
		return nil, g, nil, err
	case KindTapContract:
		c, err := d.tapContract(n, entries)
		return nil, nil, c, err
	case KindTrafficControl:
		c, err := d.trafficControl(n, entries)
		return nil, nil, c, err
	}
	p, err := d.policy(n, entries, metaE)
	return p, nil, nil, err
}

// learnName learns what the document claims to be (kind, name, namespace) before anything
// is checked, so that every error can name it.
func (d *docParser) learnName(n *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Value == "kind" && v.Kind == yaml.ScalarNode:
			d.kind = Kind(v.Value)
		case k.Value == "metadata" && v.Kind == yaml.MappingNode:
			for j := 0; j+1 < len(v.Content); j += 2 {
				mk, mv := v.Content[j], v.Content[j+1]
				if mv.Kind == yaml.ScalarNode && mv.Tag == "!!str" {
					switch mk.Value {
					case "name":
						d.name = mv.Value
					case "namespace":
						d.namespace = mv.Value
					}
				}
			}
		}
	}
}

// header checks kind, apiVersion and metadata, and returns the metadata's entry.
func (d *docParser) header(n *yaml.Node, entries []entry) (*entry, error) {
	var kindE, apiE, metaE *entry
	for i := range entries {
		switch entries[i].name {
		case "kind":
			kindE = &entries[i]
		case "apiVersion":
			apiE = &entries[i]
		case "metadata":
			metaE = &entries[i]
		}
	}

	if kindE == nil {
		return nil, d.fail(n, "kind", ReasonRequired)
	}
	kind, err := d.str(kindE.val, "kind")
	if err != nil {
		return nil, err
	}
	wantAPI := []string{apiCilium}
	switch Kind(kind) {
	case KindNetworkPolicy:
		wantAPI = []string{apiNetworking}
	case KindClusterNetworkPolicy:
		wantAPI = []string{apiPolicyNetworking}
	case KindCiliumNetworkPolicy, KindCiliumClusterwidePolicy:
	case KindCiliumCIDRGroup, KindTapContract, KindTrafficControl:
		if !d.groups {
			return nil, d.fail(kindE.val, "kind", "a %s is not a policy and cannot be given here", kind)
		}
		switch Kind(kind) {
		case KindCiliumCIDRGroup:
			// Cilium served it as v2alpha1 first and as v2 since; both are the same schema.
			wantAPI = []string{apiCiliumAlpha, apiCilium}
		case KindTapContract:
			wantAPI = []string{tap.APIVersion}
		default:
			wantAPI = []string{tap.AntreaAPIVersion}
		}
	default:
		return nil, d.fail(kindE.val, "kind", "unknown kind %q (want %s, %s, %s, %s, %s, %s or %s)", kind,
			KindNetworkPolicy, KindCiliumNetworkPolicy, KindCiliumClusterwidePolicy, KindClusterNetworkPolicy, KindCiliumCIDRGroup, KindTapContract, KindTrafficControl)
	}
	if apiE == nil {
		return nil, d.fail(n, "apiVersion", ReasonRequired)
	}
	api, err := d.str(apiE.val, "apiVersion")
	if err != nil {
		return nil, err
	}
	if !slices.Contains(wantAPI, api) {
		return nil, d.fail(apiE.val, "apiVersion", "apiVersion %q does not serve kind %s (want %s)", api, kind, strings.Join(wantAPI, " or "))
	}
	if metaE == nil {
		return nil, d.fail(n, "metadata", ReasonRequired)
	}
	if err := d.metadata(metaE.val, metaE.path); err != nil {
		return nil, err
	}
	return metaE, nil

}

// policy parses the rules of a policy document (d.kind: a policy's).
func (d *docParser) policy(n *yaml.Node, entries []entry, metaE *entry) (*Policy, error) {
	var err error
	p := &Policy{Kind: d.kind, Namespace: d.namespace, Name: d.name, Source: d.sourceName()}
	// The rendering only reads the tree: done alongside the rules, a large YAML policy's
	// rendering costs no time of its own. The rules' error, if any, comes first, as it
	// would in sequence.
	type rendering struct {
		raw []byte
		err error
	}
	rendered := make(chan rendering, 1)
	go func() {
		raw, err := d.toJSON(n)
		rendered <- rendering{raw, err}
	}()
	switch d.kind {
	case KindNetworkPolicy:
		p.Rules, err = d.networkPolicy(n, entries)
	case KindClusterNetworkPolicy:
		// Its rules carry their index within their direction, which is their precedence.
		p.Rules, err = d.clusterNetworkPolicy(n, entries)
	default:
		p.Rules, err = d.ciliumPolicy(n, entries)
	}
	r := <-rendered
	if err != nil {
		return nil, err
	}
	if d.kind != KindClusterNetworkPolicy {
		for i := range p.Rules {
			p.Rules[i].Index = i
		}
	}
	if d.audit {
		p.Audit = true
		for i := range p.Rules {
			if p.Rules[i].Host {
				return nil, d.fail(metaE.val, fieldPath(fieldPath(metaE.path, "annotations"), AuditAnnotation),
					"audit mode is not supported for host policy (a rule with a nodeSelector)")
			}
			p.Rules[i].Audit = true
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	p.Raw = r.raw
	return p, nil
}

var (
	// dnsSubdomainRE is the Kubernetes object name syntax (RFC 1123 subdomain).
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// dnsLabelRE is the Kubernetes namespace name syntax (RFC 1123 label).
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

func validName(s string) bool      { return len(s) <= 253 && dnsSubdomainRE.MatchString(s) }
func validNamespace(s string) bool { return len(s) <= 63 && dnsLabelRE.MatchString(s) }

// annotations checks the metadata's annotations and reads AuditAnnotation.
func (d *docParser) annotations(n *yaml.Node, path string) error {
	entries, err := d.mapping(n, path)
	if err != nil {
		return err
	}
	for _, e := range entries {
		v, err := d.str(e.val, e.path)
		if err != nil {
			return err
		}
		if e.name != AuditAnnotation {
			continue
		}
		switch {
		case d.kind != KindNetworkPolicy && d.kind != KindCiliumNetworkPolicy &&
			d.kind != KindCiliumClusterwidePolicy && d.kind != KindClusterNetworkPolicy:
			return d.fail(e.key, e.path, "audit mode is for policies, not a %s", d.kind)
		case v == "true":
			d.audit = true
		case v == "false":
		default:
			return d.fail(e.val, e.path, "must be \"true\" or \"false\", not %q", v)
		}
	}
	return nil
}

// metadata checks the object metadata and records name and namespace. Only informational
// fields are accepted besides those two; anything that could change behaviour (say
// ownerReferences or finalizers) is refused like any other unknown field.
func (d *docParser) metadata(n *yaml.Node, path string) error {
	entries, err := d.mapping(n, path)
	if err != nil {
		return err
	}
	var nameE, nsE *entry
	for i, e := range entries {
		switch e.name {
		case "name":
			v, err := d.str(e.val, e.path)
			if err != nil {
				return err
			}
			if !validName(v) {
				return d.fail(e.val, e.path, "invalid name %q: must be lowercase alphanumerics, '-' and '.', at most 253 characters", v)
			}
			d.name, nameE = v, &entries[i]
		case "namespace":
			v, err := d.str(e.val, e.path)
			if err != nil {
				return err
			}
			if v == "" && d.kind == KindClusterNetworkPolicy {
				// What a cluster-scoped object's namespace is; refused below otherwise.
				d.namespace, nsE = v, &entries[i]
				continue
			}
			if !validNamespace(v) {
				return d.fail(e.val, e.path, "invalid namespace %q: must be lowercase alphanumerics and '-', at most 63 characters", v)
			}
			d.namespace, nsE = v, &entries[i]
		case "labels":
			if err := d.stringMap(e.val, e.path); err != nil {
				return err
			}
		case "annotations":
			if err := d.annotations(e.val, e.path); err != nil {
				return err
			}
		case "description":
			if _, err := d.str(e.val, e.path); err != nil {
				return err
			}
		case "uid", "resourceVersion", "creationTimestamp", "generation":
			if err := d.scalar(e.val, e.path); err != nil {
				return err
			}
		default:
			return d.unknown(e)
		}
	}
	if nameE == nil {
		return d.fail(n, fieldPath(path, "name"), ReasonRequired)
	}
	switch d.kind {
	case KindCiliumClusterwidePolicy:
		if nsE != nil {
			return d.fail(nsE.key, nsE.path, "a clusterwide policy has no namespace")
		}
		return nil
	case KindCiliumCIDRGroup:
		if nsE != nil {
			return d.fail(nsE.key, nsE.path, "a CIDR group is cluster-scoped and has no namespace")
		}
		return nil
	case KindTapContract, KindTrafficControl:
		if nsE != nil {
			return d.fail(nsE.key, nsE.path, "a %s is cluster-scoped and has no namespace (its endpoints are named NAMESPACE/NAME)", d.kind)
		}
		return nil
	case KindClusterNetworkPolicy:
		if nsE != nil && d.namespace != "" {
			return d.fail(nsE.key, nsE.path, "a ClusterNetworkPolicy is cluster-scoped and has no namespace (its subject selects namespaces)")
		}
		return nil
	}
	if d.namespace == "" {
		d.namespace = defaultNamespace
	}
	return nil
}
