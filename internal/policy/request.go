package policy

import (
	"errors"
	"fmt"
	"strings"
)

// Manifest is one source of a request: its name (a file, or "-" for stdin) and its bytes.
type Manifest struct {
	Source string
	Data   []byte
}

// ParseRequest parses every manifest of one request (the agent's apply and delete, and
// `rampart apply --dry-run`, which must judge alike) with parse, all of them or none: the
// first error refuses the request. The limits bound each source, and here the request as a
// whole (its sources' bytes together, and the objects they hold), so that no request costs
// more than one source may; an error over a limit is a *LimitError.
func ParseRequest(parse func(source string, data []byte) (*Documents, error), ms []Manifest) (*Documents, error) {
	if len(ms) == 0 {
		return nil, errors.New("no manifests given")
	}
	if len(ms) > MaxSources {
		return nil, &LimitError{Source: "request", Limit: LimitSources, Value: int64(len(ms)), Max: MaxSources}
	}
	total := 0
	for i, m := range ms {
		// Checked as the CLI checks when it reads files, so that both give the same message.
		if len(m.Data) > MaxManifestBytes {
			return nil, &LimitError{Source: m.Source, Limit: LimitSize, Value: int64(len(m.Data)), Max: MaxManifestBytes}
		}
		if total += len(m.Data); total > MaxManifestBytes {
			return nil, &LimitError{Source: fmt.Sprintf("request (%d manifests)", i+1), Limit: LimitSize, Value: int64(total), Max: MaxManifestBytes}
		}
	}
	out := &Documents{}
	var sources []string
	for _, m := range ms {
		d, err := parse(m.Source, m.Data)
		if err != nil {
			return nil, err
		}
		out.Policies = append(out.Policies, d.Policies...)
		out.CIDRGroups = append(out.CIDRGroups, d.CIDRGroups...)
		out.Taps = append(out.Taps, d.Taps...)
		sources = append(sources, m.Source)
		if n := len(out.Policies) + len(out.CIDRGroups) + len(out.Taps); n > MaxDocuments {
			return nil, &LimitError{Source: m.Source, Limit: LimitPolicies, Value: int64(n), Max: MaxDocuments}
		}
	}
	if len(out.Policies) == 0 && len(out.CIDRGroups) == 0 && len(out.Taps) == 0 {
		return nil, fmt.Errorf("%s: no policies found", strings.Join(sources, ", "))
	}
	return out, nil
}

// CheckUnique refuses documents that give one object twice (kind, namespace and name), in
// two sources or in one: which of them an apply kept would be an accident of file order.
// The message names both places.
func CheckUnique(d *Documents) error {
	seen := map[string]string{}
	check := func(what, source string) error {
		if first, ok := seen[what]; ok {
			return fmt.Errorf("%s is in %s and again in %s: give each object once", what, first, source)
		}
		seen[what] = source
		return nil
	}
	for _, p := range d.Policies {
		ns := ""
		if p.Namespace != "" {
			ns = " in namespace " + p.Namespace
		}
		if err := check(fmt.Sprintf("%s %q%s", p.Kind, p.Name, ns), p.Source); err != nil {
			return err
		}
	}
	for _, g := range d.CIDRGroups {
		if err := check(fmt.Sprintf("%s %q", KindCiliumCIDRGroup, g.Name), g.Source); err != nil {
			return err
		}
	}
	// Tap contracts of both kinds share one space of names.
	for _, c := range d.Taps {
		if err := check(fmt.Sprintf("tap contract %q", c.Name), c.Origin); err != nil {
			return err
		}
	}
	return nil
}
