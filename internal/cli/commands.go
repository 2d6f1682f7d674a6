package cli

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

func (a *app) namespaceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "namespace",
		Aliases: []string{"namespaces", "ns"},
		Short:   "Label and list namespaces",
	}
	var output string
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List namespaces and their labels",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			nss, err := a.client.ListNamespaces(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(nss)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAMESPACE\tENDPOINTS\tLABELS")
			for _, ns := range nss {
				fmt.Fprintf(w, "%s\t%d\t%s\n", ns.Name, ns.Endpoints, labelString(ns.Labels))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	label := &cobra.Command{
		Use:   "label NAMESPACE k=v... [k-...]",
		Short: "Set (k=v) or remove (k-) namespace labels, creating the namespace if needed",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := parseLabelArgs(args[1:])
			if err != nil {
				return err
			}
			ns, err := a.client.LabelNamespace(contextOf(cmd), args[0], c)
			if err != nil {
				return err
			}
			a.printf("namespace %s labelled: %s\n", ns.Name, labelString(ns.Labels))
			return nil
		},
	}
	cmd.AddCommand(list, label)
	return cmd
}

func (a *app) identityCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "identity",
		Aliases: []string{"identities", "id"},
		Short:   "List security identities",
	}
	var output string
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List identities: number, labels or prefix, endpoints using it",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := a.client.ListIdentities(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ids)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tKIND\tLABELS\tENDPOINTS")
			for _, id := range ids {
				what := strings.Join(id.Labels, ",")
				if id.Prefix != "" {
					what = "cidr:" + id.Prefix
				}
				eps := strings.Join(id.Endpoints, ",")
				if eps == "" {
					eps = "-"
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", id.ID, id.Kind, what, eps)
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.AddCommand(list)
	return cmd
}

// readManifests reads every -f argument: a file, a directory (its .yaml, .yml and .json
// files, sorted; not recursive) or "-" for stdin. Manifests over a limit of package policy
// are refused here, with the agent's message, before anything is sent.
func (a *app) readManifests(files []string) ([]api.Document, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("no manifests: give -f FILE|DIR|-")
	}
	var docs []api.Document
	total := 0
	add := func(source string, r io.Reader) error {
		if len(docs) == policy.MaxSources {
			return &policy.LimitError{Source: "request", Limit: policy.LimitSources, Value: int64(len(docs) + 1), Max: policy.MaxSources}
		}
		data, err := readManifest(source, r)
		if err != nil {
			return err
		}
		total += len(data)
		if total > policy.MaxManifestBytes {
			return &policy.LimitError{Source: fmt.Sprintf("request (%d manifests)", len(docs)+1), Limit: policy.LimitSize, Value: int64(total), Max: policy.MaxManifestBytes}
		}
		docs = append(docs, api.Document{Source: source, Data: string(data)})
		return nil
	}
	readFile := func(name string) error {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("reading manifests: %w", err)
		}
		defer f.Close()
		return add(name, f)
	}
	for _, f := range files {
		if f == "-" {
			if err := add("-", a.io.In); err != nil {
				return nil, err
			}
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		if !st.IsDir() {
			if err := readFile(f); err != nil {
				return nil, err
			}
			continue
		}
		entries, err := os.ReadDir(f)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		n := 0
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
				continue
			}
			if err := readFile(filepath.Join(f, e.Name())); err != nil {
				return nil, err
			}
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: no .yaml, .yml or .json files", f)
		}
	}
	return docs, nil
}

// readManifest reads one manifest source, keeping no more than the size limit in memory,
// and checks it against the limits of package policy.
func readManifest(source string, r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, policy.MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", source, err)
	}
	if len(data) > policy.MaxManifestBytes {
		// Count the rest without keeping it, to say how large the source is.
		rest, err := io.Copy(io.Discard, r)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", source, err)
		}
		return nil, &policy.LimitError{Source: source, Limit: policy.LimitSize, Value: int64(len(data)) + rest, Max: policy.MaxManifestBytes}
	}
	if err := policy.CheckLimits(source, data); err != nil {
		return nil, err
	}
	return data, nil
}

func (a *app) printChanges(res api.ChangeResult) {
	for _, c := range res.Changes {
		ns := ""
		if c.Namespace != "" {
			ns = " (namespace " + c.Namespace + ")"
		}
		a.printf("%s/%s %s%s\n", strings.ToLower(c.Kind), c.Name, c.Action, ns)
	}
}

// changeString names a change's object: kind/name, with its namespace.
func changeString(c api.PolicyChange) string {
	s := strings.ToLower(c.Kind) + "/" + c.Name
	if c.Namespace != "" {
		s += " (namespace " + c.Namespace + ")"
	}
	return s
}

func (a *app) applyCommand() *cobra.Command {
	var files []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|- [-f ...]",
		Short: "Create or update policies, CIDR groups (CiliumCIDRGroup) and tap contracts (TapContract, TrafficControl) from manifests (all of them or none)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			docs, err := a.readManifests(files)
			if err != nil {
				return err
			}
			if dryRun {
				return a.checkManifests(docs)
			}
			res, err := a.client.Apply(contextOf(cmd), api.ApplyRequest{Documents: docs})
			if err != nil {
				return err
			}
			a.printChanges(res)
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check the manifests with the agent's parser and rules, here, and apply nothing (no agent needed)")
	return cmd
}

// checkManifests is `apply --dry-run`: the agent's parser and its checks of a request
// before it looks at its state (policy.ParseRequest, policy.CheckUnique), here, with no
// agent; it prints each object and where it was read.
func (a *app) checkManifests(docs []api.Document) error {
	ms := make([]policy.Manifest, len(docs))
	for i, d := range docs {
		ms[i] = policy.Manifest{Source: d.Source, Data: []byte(d.Data)}
	}
	d, err := policy.ParseRequest(policy.Parse, ms)
	if err == nil {
		err = policy.CheckUnique(d)
	}
	if err != nil {
		return err
	}
	for _, p := range d.Policies {
		a.printf("%s valid (%s)\n", changeString(api.PolicyChange{Kind: string(p.Kind), Namespace: p.Namespace, Name: p.Name}), p.Source)
	}
	for _, g := range d.CIDRGroups {
		a.printf("%s valid (%s)\n", changeString(api.PolicyChange{Kind: string(policy.KindCiliumCIDRGroup), Name: g.Name}), g.Source)
	}
	for _, c := range d.Taps {
		a.printf("%s valid (%s)\n", changeString(api.PolicyChange{Kind: c.Kind, Name: c.Name}), c.Origin)
	}
	a.printf("dry run: %d objects checked, nothing applied\n", len(d.Policies)+len(d.CIDRGroups)+len(d.Taps))
	return nil
}

func (a *app) deleteCommand() *cobra.Command {
	var files []string
	var ignore bool
	cmd := &cobra.Command{
		Use:   "delete -f FILE|DIR|- [-f ...]",
		Short: "Delete the policies, CIDR groups and tap contracts named in manifests; fails naming those that do not exist, after deleting the rest",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			docs, err := a.readManifests(files)
			if err != nil {
				return err
			}
			// The agent deletes what exists and lists what does not; one object that is
			// gone already must not keep the others.
			res, err := a.client.Delete(contextOf(cmd), api.DeleteRequest{Documents: docs, IgnoreNotFound: true})
			if err != nil {
				return err
			}
			a.printChanges(res)
			var missing []string
			for _, c := range res.Changes {
				if c.Action == "not found" {
					missing = append(missing, changeString(c)+" (in "+c.Source+")")
				}
			}
			if len(missing) > 0 && !ignore {
				return fmt.Errorf("not found, the rest deleted: %s", strings.Join(missing, "; "))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	cmd.Flags().BoolVar(&ignore, "ignore-not-found", false, "exit 0 when some of the objects do not exist")
	return cmd
}

func (a *app) getCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "get", Short: "Show stored objects"}
	var output string
	pols := &cobra.Command{
		Use:     "policies",
		Aliases: []string{"policy", "pol"},
		Short:   "List policies: kind, namespace, name, rules, source",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := a.client.ListPolicies(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ps)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tNAMESPACE\tNAME\tRULES\tMODE\tSOURCE")
			for _, p := range ps {
				ns := p.Namespace
				if ns == "" {
					ns = "-"
				}
				var rules []string
				for _, r := range p.Rules {
					rules = append(rules, r.Description)
				}
				rs := strings.Join(rules, ",")
				if rs == "" {
					rs = "-"
				}
				mode := "enforce"
				if p.Audit {
					mode = "audit"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Kind, ns, p.Name, rs, mode, p.Source)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			for _, p := range ps {
				if len(p.MissingCIDRGroups) > 0 {
					a.printf("note: %s names CIDR groups that do not exist (those peers select nothing): %s\n", p.Ref(), strings.Join(p.MissingCIDRGroups, ", "))
				}
			}
			return nil
		},
	}
	pols.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.AddCommand(pols)
	return cmd
}

func (a *app) policyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Explain policy decisions, and suggest policy from observed flows"}
	var from, to, port, output string
	trace := &cobra.Command{
		Use:   "trace --from NS/NAME|IP --to NS/NAME|IP --port PORT/PROTO",
		Short: "Say whether a new connection is allowed, and which policy and rule decide on each side",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if from == "" || to == "" || port == "" {
				return fmt.Errorf("--from, --to and --port are required")
			}
			p, proto, err := parsePortProto(port)
			if err != nil {
				return err
			}
			res, err := a.client.Trace(contextOf(cmd), api.TraceRequest{From: from, To: to, Port: p, Protocol: proto})
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(res)
			}
			verdict := "DENIED"
			switch {
			case res.Redirected:
				verdict = "ALLOWED, redirected to L7 proxy (each request must match an L7 rule)"
			case res.Allowed:
				verdict = "ALLOWED"
			}
			a.printf("%s (id %d%s) -> %s (id %d%s) %d/%s: %s\n", res.From, res.FromIdent, groupsNote(res.FromCIDRGroups),
				res.To, res.ToIdent, groupsNote(res.ToCIDRGroups), res.Port, res.Protocol, verdict)
			for _, s := range res.Sides {
				v := "denied"
				switch {
				case s.Redirected:
					v = "redirected to L7 proxy"
				case s.Allowed:
					v = "allowed"
				}
				rule := ""
				if s.Rule != nil {
					rule = " by " + ruleString(s.Rule)
				}
				if s.Tier != "" {
					rule += " (" + s.Tier + " tier)"
				}
				if s.CIDRGroup != "" {
					field := "toCIDRSet"
					if s.Direction == "ingress" {
						field = "fromCIDRSet"
					}
					rule += " " + field + " cidrGroupRef=" + s.CIDRGroup
				}
				at := s.Endpoint
				if s.Node != "" {
					at += " (node " + s.Node + ")"
				}
				if len(s.DefaultDenyBy) > 0 {
					rule += " of " + strings.Join(s.DefaultDenyBy, ", ")
				}
				a.printf("  %-7s at %s: %s%s (%s)\n", s.Direction, at, v, rule, s.Reason)
				if au := s.Audit; au != nil {
					by := ""
					if au.Rule != nil {
						by = " by " + ruleString(au.Rule)
					}
					if au.Tier != "" {
						by += " (" + au.Tier + " tier)"
					}
					if len(au.DefaultDenyBy) > 0 {
						by += " of " + strings.Join(au.DefaultDenyBy, ", ")
					}
					a.printf("    AUDIT: policies in audit mode would deny it%s (%s); forwarded\n", by, au.Reason)
				}
				for _, l := range s.L7 {
					from := ""
					if l.Rule != nil {
						from = " (" + ruleString(l.Rule) + ")"
					}
					for _, h := range l.HTTP {
						a.printf("    allow %s%s\n", h, from)
					}
				}
			}
			if res.Diagnostic != "" {
				a.printf("  %s\n", res.Diagnostic)
			}
			return nil
		},
	}
	trace.Flags().StringVar(&from, "from", "", "source endpoint NS/NAME or address")
	trace.Flags().StringVar(&to, "to", "", "destination endpoint NS/NAME or address")
	trace.Flags().StringVar(&port, "port", "", "destination PORT/PROTO (e.g. 80/TCP; for ICMP the type, e.g. 8/ICMP)")
	trace.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.AddCommand(trace, a.suggestCommand())
	return cmd
}

// groupsNote renders the CIDR sets an address is in: ", in CIDR groups a, b".
func groupsNote(groups []string) string {
	if len(groups) == 0 {
		return ""
	}
	return ", in CIDR groups " + strings.Join(groups, ", ")
}

func ruleString(r *api.RuleRef) string {
	if r.Policy == "" {
		return fmt.Sprintf("rule %d", r.ID)
	}
	return r.Policy + " " + r.Rule
}

// statusCommand prints what matters first (the agent, whether it is degraded, the
// cluster sync and its errors), then what it manages; the map table only with --maps.
func (a *app) statusCommand() *cobra.Command {
	var output string
	var maps, ready bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show whether the agent is up and in sync, its errors, and what it manages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.client.Status(contextOf(cmd))
			if err != nil {
				return err
			}
			if ready {
				// A Kubernetes probe: ready once the cluster's view is applied.
				if k := st.Kubernetes; k != nil && !k.Synced {
					why := "the cluster's view is not applied yet"
					if k.LastError != "" {
						why += " (last error: " + k.LastError + ")"
					}
					return errors.New("not ready: " + why)
				}
				fmt.Fprintln(a.io.Out, "ready")
				return nil
			}
			if output == "json" {
				return a.printJSON(st)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 1, ' ', 0)
			fmt.Fprintf(w, "Agent:\tup since %s\n", st.StartedAt.Local().Format(time.RFC3339))
			fmt.Fprintf(w, "Instance:\t%s\n", st.Instance)
			if st.Version != "" {
				fmt.Fprintf(w, "Version:\t%s\n", st.Version)
			}
			if st.Degraded != "" {
				fmt.Fprintf(w, "DEGRADED:\t%s\n", st.Degraded)
			}
			if k := st.Kubernetes; k != nil {
				printKubernetes(w, k)
			}
			if tp := st.TapPolicy; tp != nil && tp.Error != "" {
				fmt.Fprintf(w, "TAP POLICY ERROR:\t%s (since %s; its last good contracts stay installed)\n", tp.Error, tp.ErrorAt.Format("2006-01-02T15:04:05Z07:00"))
			}
			if m := st.Monitors; m != nil && m.Error != "" {
				fmt.Fprintf(w, "Monitors error:\t%s\n", m.Error)
			}
			if m := st.Memory; m != nil && m.Error != "" {
				fmt.Fprintf(w, "Memory error:\t%s\n", m.Error)
			}
			node := st.NodeNetns
			if node == "" {
				node = "<root>"
			}
			fmt.Fprintf(w, "Node namespace:\t%s\n", node)
			fmt.Fprintf(w, "Pod CIDR:\t%s (router %s)\n", st.PodCIDR, st.Router)
			if st.PodCIDR6 != "" {
				fmt.Fprintf(w, "IPv6 pod CIDR:\t%s (router %s)\n", st.PodCIDR6, st.Router6)
			}
			fmt.Fprintf(w, "Endpoints:\t%d\n", st.Endpoints)
			fmt.Fprintf(w, "Namespaces:\t%d\n", st.Namespaces)
			fmt.Fprintf(w, "Policies:\t%d\n", st.Policies)
			fmt.Fprintf(w, "Identities:\t%d allocated\n", st.Identities)
			fmt.Fprintf(w, "CIDR sets:\t%d\n", st.CIDRSets)
			fmt.Fprintf(w, "Flows:\t%d seen, %d lost\n", st.FlowsSeen, st.FlowsLost)
			fmt.Fprintf(w, "State:\t%s\n", st.StateDir)
			fmt.Fprintf(w, "BPF pins:\t%s\n", st.BPFDir)
			fmt.Fprintf(w, "L7 proxy:\t%s\n", proxyLine(st.Proxy))
			fmt.Fprintf(w, "DNS proxy:\t%s\n", dnsLine(st.DNS))
			if s := st.SendSide; s != nil {
				fmt.Fprintf(w, "L7 send-side:\t%d pairs; requests: %d passed, %d refused (403), %d outside the subset (400), %d failed sends; %d events lost\n",
					s.Pairs, s.Passed, s.Refused, s.OutsideSubset, s.SendFailed, s.EventsLost)
			}
			if h := st.Host; h != nil {
				fmt.Fprintf(w, "Host policy:\t%s\n", hostLine(h))
			}
			if tp := st.TapPolicy; tp != nil {
				fmt.Fprintf(w, "Tap policy:\t%s: %d contracts, %d requests unplaced\n", tp.File, tp.Contracts, tp.Unplaced)
			}
			if m := st.Monitors; m != nil {
				fmt.Fprintf(w, "Monitors:\t%d here; copies from other nodes: %d delivered, %d lost; packets monitors sent that were not diverted to them: %d dropped\n",
					m.Monitors, m.CopiesFromOtherNodes, m.CopiesFromOtherNodesLost, m.NotDiverted)
				for _, d := range m.Down {
					fmt.Fprintf(w, "Monitor down:\t%s\n", d)
				}
			}
			if m := st.Memory; m != nil {
				hint := " (--maps lists them)"
				if maps {
					hint = ":"
				}
				fmt.Fprintf(w, "Memory:\tagent RSS %s (anonymous %s); BPF maps %s in %d maps%s\n",
					bytesString(m.RSSBytes), bytesString(m.RSSAnonBytes), bytesString(m.MapBytes), len(m.Maps), hint)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if maps && st.Memory != nil {
				return printMaps(a.io.Out, st.Memory)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.Flags().BoolVar(&maps, "maps", false, "also list the dataplane's maps and their memory")
	cmd.Flags().BoolVar(&ready, "ready", false, "only say whether the agent is ready (exit 0: it answers and, in Kubernetes mode, has applied the cluster's view; the DaemonSet's readiness probe)")
	return cmd
}

// printKubernetes prints the node's view of the cluster in Kubernetes mode.
func printKubernetes(w io.Writer, k *api.KubernetesStatus) {
	node := k.NodeName
	if k.NodeAddress != "" {
		node += " (" + k.NodeAddress + ")"
	}
	fmt.Fprintf(w, "Kubernetes node:\t%s\n", node)
	fmt.Fprintf(w, "Cluster:\t%d other nodes, %d remote pods\n", k.Nodes, k.RemoteEndpoints)
	sync := "informers not synced yet"
	switch {
	case k.Failing:
		sync = "FAILING: the cluster's view cannot be applied (Last error); the dataplane enforces the last view applied"
		if !k.LastSync.IsZero() {
			sync += fmt.Sprintf(" (applied %s)", k.LastSync.Local().Format(time.RFC3339))
		}
	case k.Synced && !k.Clean:
		sync = fmt.Sprintf("synced with problems: %d refused, %d left out, %d unresolved (below); %d syncs, last %s",
			len(k.Refused), len(k.Problems), len(k.Unresolved), k.Syncs, k.LastSync.Local().Format(time.RFC3339))
	case k.Synced:
		sync = fmt.Sprintf("synced, %d syncs, last %s", k.Syncs, k.LastSync.Local().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "Sync:\t%s\n", sync)
	if k.LastError != "" {
		fmt.Fprintf(w, "Last error:\t%s: %s\n", k.LastErrorAt.Local().Format(time.RFC3339), k.LastError)
	}
	for _, r := range k.Refused {
		fmt.Fprintf(w, "Refused:\t%s: %s\n", r.Object, r.Error)
	}
	for _, p := range k.Problems {
		fmt.Fprintf(w, "Left out:\t%s\n", p)
	}
	for _, u := range k.Unresolved {
		fmt.Fprintf(w, "Unresolved:\t%s: %s\n", u.Object, u.Error)
	}
	for _, q := range k.Quarantined {
		why := "its pod is still in the API"
		if len(q.WaitingFor) > 0 {
			why = "waiting for node(s) " + strings.Join(q.WaitingFor, ", ")
		} else if q.Since != "" {
			why = "released at the next sync"
		}
		fmt.Fprintf(w, "Quarantined:\t%s (pod %s): %s\n", q.Address, q.Pod, why)
	}
}

// printMaps prints the dataplane's maps, largest first, and their total.
func printMaps(out io.Writer, m *api.MemoryStatus) error {
	maps := slices.Clone(m.Maps)
	sort.SliceStable(maps, func(i, j int) bool { return maps[i].Bytes > maps[j].Bytes })
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  MAP\tTYPE\tENTRIES\tBYTES")
	trie := false
	for _, mm := range maps {
		fmt.Fprintf(w, "  %s\t%s\t%d\t%s\n", mm.Name, mm.Type, mm.MaxEntries, bytesString(mm.Bytes))
		trie = trie || mm.Type == "LPMTrie"
	}
	fmt.Fprintf(w, "  total\t\t\t%s\n", bytesString(m.MapBytes))
	if err := w.Flush(); err != nil {
		return err
	}
	if trie {
		fmt.Fprintln(out, "  (bytes: the kernel's memlock; for an LPMTrie it counts keys and values only, its real memory is several times that)")
	}
	return nil
}

// proxyLine summarises the L7 proxy's status, e.g. "running (pid 123, 0 restarts, config
// version 7 applied, 3 chains, 127.0.0.1:15001)".
func proxyLine(p api.ProxyStatus) string {
	var b strings.Builder
	b.WriteString(p.State)
	if p.State == "not started" {
		b.WriteString(" (no L7 rules so far)")
	}
	if p.State != "not started" && p.State != "unavailable" {
		applied := "applied"
		if p.AckedVersion != p.Version {
			applied = fmt.Sprintf("published, %d applied", p.AckedVersion)
		}
		pid := ""
		if p.PID != 0 {
			pid = fmt.Sprintf("pid %d, ", p.PID)
		}
		fmt.Fprintf(&b, " (%s%d restarts, config version %d %s, %d chains, %s)", pid, p.Restarts, p.Version, applied, p.Chains, p.Listen)
	}
	if f := p.FastPath; f != nil {
		fmt.Fprintf(&b, "; fast path on %s: %d requests checked, %d denied, %d connections handed to Envoy, %d open",
			f.Listen, f.Requests, f.Denied, f.HandedOver, f.Open)
	}
	if p.LastExit != "" {
		fmt.Fprintf(&b, "; last exit: %s", p.LastExit)
	}
	if p.Error != "" {
		fmt.Fprintf(&b, "; error: %s", p.Error)
	}
	return b.String()
}

// dnsLine is the status line of the DNS proxy and the learnt names.
func hostLine(h *api.HostStatus) string {
	enforce := "open"
	switch {
	case h.EnforceIngress && h.EnforceEgress:
		enforce = "ingress and egress enforced"
	case h.EnforceIngress:
		enforce = "ingress enforced"
	case h.EnforceEgress:
		enforce = "egress enforced"
	}
	s := fmt.Sprintf("on %s, %s (labels %s)", strings.Join(h.Devices, ","), enforce, labels.Labels(h.Labels))
	if len(h.Safe) > 0 {
		s += "; never cut: " + strings.Join(h.Safe, ",")
	}
	return s
}

func dnsLine(d api.DNSStatus) string {
	s := d.State
	if d.Listen != "" {
		s += " on " + d.Listen
	}
	if d.Error != "" {
		s += ": " + d.Error
	}
	s += fmt.Sprintf("; queries: %d allowed, %d refused, %d forwarded, %d SERVFAIL", d.Allowed, d.Refused, d.Forwarded, d.UpstreamErrors+d.LearnErrors)
	var drops []string
	for _, r := range slices.Sorted(maps.Keys(d.Drops)) {
		drops = append(drops, fmt.Sprintf("%d %s", d.Drops[r], r))
	}
	if len(drops) > 0 {
		s += ", dropped " + strings.Join(drops, ", ")
	}
	if d.Observing != "" {
		s += fmt.Sprintf("; observing on %s: %d queries", d.Observing, d.Observed)
	}
	return s + fmt.Sprintf("; learnt: %d names, %d addresses, %d kept for open connections", d.Names, d.Addresses, d.Zombies)
}
