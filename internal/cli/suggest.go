package cli

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/suggest"
)

// suggestCommand is `rampart policy suggest`: the agent's flow history and endpoints, read
// over its API, turned into manifests by package suggest (here, in the CLI: the agent
// needs no new call for it).
func (a *app) suggestCommand() *cobra.Command {
	var (
		since, outDir string
		opts          suggest.Options
		cidrs         []string
		cluster       clusterFlags
	)
	cmd := &cobra.Command{
		Use:   "suggest [--since DURATION] [--namespace NS] [--endpoint NS/NAME]... [--l7] [--audit] [--cidr CIDR]... [-o DIR] [--cluster]",
		Short: "Write NetworkPolicy (and CiliumNetworkPolicy) manifests that admit exactly the allowed traffic in the agent's (or the cluster's) flows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, k := range opts.Endpoints {
				if _, _, err := splitKey(k); err != nil {
					return fmt.Errorf("--endpoint: %w", err)
				}
			}
			for _, c := range cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return fmt.Errorf("--cidr %q: want a prefix such as 203.0.113.0/24", c)
				}
				opts.CIDRs = append(opts.CIDRs, p.Masked())
			}
			req := api.ObserveRequest{SinceStart: true}
			if since != "" {
				t, err := parseTime(since, time.Now())
				if err != nil {
					return fmt.Errorf("--since: %w", err)
				}
				req.Filter.Since = t
			}
			ctx := contextOf(cmd)
			src, err := a.source(cluster)
			if err != nil {
				return err
			}
			eps, err := src.ListEndpoints(ctx)
			if err != nil {
				return fmt.Errorf("listing endpoints: %w", err)
			}
			remotes, err := src.ListRemoteEndpoints(ctx)
			if err != nil {
				return fmt.Errorf("listing remote endpoints: %w", err)
			}
			var flows []suggest.Flow
			err = src.Observe(ctx, req, func(f api.Flow) error {
				if sf, ok := suggestFlow(f); ok {
					flows = append(flows, sf)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("reading flows: %w", err)
			}
			var known []suggest.Endpoint
			for _, e := range eps {
				known = append(known, suggest.Endpoint{Namespace: e.Namespace, Name: e.Name, Labels: e.Labels})
			}
			for _, e := range remotes {
				known = append(known, suggest.Endpoint{Namespace: e.Namespace, Name: e.Name, Labels: e.Labels})
			}
			res, err := suggest.Suggest(flows, known, opts)
			if err != nil {
				return err
			}
			if outDir == "" {
				_, err := a.io.Out.Write(res.YAML())
				return err
			}
			return a.writeSuggested(outDir, res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "only flows since a time: a duration ago (10m) or RFC 3339; default every flow the agent holds")
	f.StringVar(&opts.Namespace, "namespace", "", "only policies for the workloads of namespace NS (their peers may be anywhere)")
	f.StringArrayVar(&opts.Endpoints, "endpoint", nil, "only policies for the workload of endpoint NS/NAME (repeatable)")
	f.BoolVar(&opts.L7, "l7", false, "add CiliumNetworkPolicy HTTP rules for the requests the L7 proxy saw")
	f.BoolVar(&opts.Audit, "audit", false, "annotate the policies with "+suggest.AuditAnnotation+`: "true" (audit mode: report, do not drop)`)
	f.StringArrayVar(&cidrs, "cidr", nil, "admit addresses outside the cluster that fall in CIDR by CIDR, not by their /32 (repeatable)")
	f.StringVarP(&outDir, "output-dir", "o", "", "write one file per policy into DIR (NAMESPACE-NAME.yaml) instead of all to stdout")
	cluster.register(f, "read the flows and endpoints")
	return cmd
}

// suggestFlow is f as package suggest reads it; ok is false for flows that say nothing of
// what policy should admit (ARP frames, events of other types).
func suggestFlow(f api.Flow) (suggest.Flow, bool) {
	sf := suggest.Flow{
		Time: f.Time, Verdict: f.Verdict, Reason: f.Reason, Protocol: f.Protocol, Port: f.Dest.Port, SourcePort: f.Source.Port,
		Source: suggestPeer(f.Source), Dest: suggestPeer(f.Dest),
	}
	if f.ICMPType != nil {
		sf.Port = uint16(*f.ICMPType)
	}
	switch {
	case f.Protocol == "ARP":
		return sf, false
	case f.Type == api.FlowTypeL7 && f.L7 != nil:
		sf.HTTP = &suggest.HTTP{Method: f.L7.Method, Path: f.L7.Path}
	case f.Type == flow.EventDrop.String(), f.Type == flow.EventNew.String():
	default:
		return sf, false
	}
	return sf, true
}

func suggestPeer(p api.FlowPeer) suggest.Peer {
	return suggest.Peer{Namespace: p.Namespace, Name: p.Name, IP: p.IP, Labels: p.Labels}
}

// writeSuggested writes each policy to DIR/NAMESPACE-NAME.yaml (each by a temporary file
// renamed into place, so that `rampart apply -f DIR` never reads half a file) and prints
// the header and the files written.
func (a *app) writeSuggested(dir string, res suggest.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	a.printf("%s", res.Header())
	for _, p := range res.Policies {
		path := filepath.Join(dir, p.Namespace+"-"+p.Name+".yaml")
		tmp := path + ".tmp"
		data := append([]byte("# rampart policy suggest: "+p.Kind+" "+p.Namespace+"/"+p.Name+"\n"), p.YAML...)
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("writing %s: %w", path, err)
		}
		a.printf("wrote %s\n", path)
	}
	return nil
}
