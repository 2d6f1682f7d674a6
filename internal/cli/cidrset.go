package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cidrlist"
)

// The list file is parsed here, in the CLI, and sent to the agent in the compact binary
// form of api.PrefixList (5 bytes per IPv4 prefix): the agent never reads user files (it
// may run in another mount namespace, and a file it cannot parse should fail before
// anything is sent), and the agent's lock is not held while ten million lines are parsed.

func (a *app) cidrsetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "cidrset",
		Aliases: []string{"cidrsets"},
		Short:   "Manage CIDR sets (CIDR groups) that policies name with toCIDRSet/fromCIDRSet cidrGroupRef",
	}
	cmd.AddCommand(a.cidrsetLoad(),
		a.cidrsetEdit("add NAME CIDR...", "Add CIDRs or addresses to a CIDR set in place (creating the set if needed)", (*api.Client).AddCIDRs),
		a.cidrsetEdit("remove NAME CIDR...", "Remove CIDRs or addresses (exactly as listed) from a CIDR set in place", (*api.Client).RemoveCIDRs),
		a.cidrsetList(), a.cidrsetGet(), a.cidrsetDelete())
	return cmd
}

func (a *app) cidrsetLoad() *cobra.Command {
	var file, source string
	load := &cobra.Command{
		Use:   "load NAME --file LIST",
		Short: "Create a CIDR set from a list file (one CIDR or address per line, # comments), or replace its content",
		Long: `Create a CIDR set from a list file, or replace the content of an existing one.

LIST has one IPv4 or IPv6 CIDR or bare address (a /32 or /128) per line; '#' starts a
comment; blank lines, spaces, tabs and CRLF line ends are fine; host bits are cleared. A bad
line fails the command with LIST:LINE and nothing is loaded. Use --file - for stdin.

The dataplane builds the new content aside and switches to it at once: there is no moment
in which neither the old nor the new content applies.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return fmt.Errorf("--file is required (a list file, or - for stdin)")
			}
			return a.loadCIDRSet(contextOf(cmd), args[0], file, source)
		},
	}
	load.Flags().StringVarP(&file, "file", "f", "", "list file, or - for stdin")
	load.Flags().StringVar(&source, "source", "", "what to record as the set's source (default: file NAME)")
	return load
}

// cidrsetEdit is add or remove: the CIDRs of the arguments sent by edit (a method of the
// client, which exists only once the command runs).
func (a *app) cidrsetEdit(use, short string, edit func(*api.Client, context.Context, api.CIDRSetRequest) (api.CIDRSetChange, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := cidrlist.ParseArgs(args[1:])
			if err != nil {
				return err
			}
			res, err := edit(a.client, contextOf(cmd), api.CIDRSetRequest{Name: args[0], Prefixes: l})
			if err != nil {
				return err
			}
			a.printChange(res, 0, 0)
			return nil
		},
	}
}

func (a *app) cidrsetList() *cobra.Command {
	var output string
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List CIDR sets: index, prefixes, source, policies naming them",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sets, err := a.client.ListCIDRSets(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(sets)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tINDEX\tPREFIXES\tIPV4\tIPV6\tLOADED\tSOURCE\tPOLICIES")
			for _, s := range sets {
				refs := strings.Join(s.ReferencedBy, ",")
				if refs == "" {
					refs = "-"
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Name, s.Index, s.Prefixes, s.IPv4, s.IPv6,
					s.LoadedAt.Local().Format(time.RFC3339), s.Source, refs)
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return list
}

func (a *app) cidrsetGet() *cobra.Command {
	var output string
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a CIDR set: prefix counts by family and length, memory per prefix, last load",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.client.GetCIDRSet(contextOf(cmd), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(s)
			}
			a.printCIDRSet(s)
			return nil
		},
	}
	get.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return get
}

func (a *app) cidrsetDelete() *cobra.Command {
	var force bool
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a CIDR set (one that policies name only with --force)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.client.DeleteCIDRSet(contextOf(cmd), args[0], force)
			if err != nil {
				return err
			}
			a.printf("cidrset %s deleted (%d prefixes)\n", args[0], res.Removed)
			return nil
		},
	}
	del.Flags().BoolVar(&force, "force", false, "delete even if policies name the set: their cidrGroupRef peers then select nothing")
	return del
}

// loadCIDRSet parses a list file and loads it as set name.
func (a *app) loadCIDRSet(ctx context.Context, name, file, source string) error {
	start := time.Now()
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(a.io.In)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("reading list: %w", err)
	}
	if source == "" {
		source = "file " + file
	}
	bar := a.newProgress(fmt.Sprintf("cidrset %s", name), int64(len(data)))
	defer bar.stop()
	l, _, err := cidrlist.Parse(file, data, &bar.done)
	if err != nil {
		return err
	}
	data = nil // the list can be collected while the agent works
	parsed := time.Since(start)
	bar.phase(fmt.Sprintf("parsed %d prefixes in %s; loading", l.Len(), round(parsed)))
	res, err := a.client.LoadCIDRSet(ctx, api.CIDRSetRequest{Name: name, Source: source, Prefixes: l})
	bar.stop()
	if err != nil {
		return err
	}
	a.printChange(res, time.Since(start), parsed)
	return nil
}

// printChange prints the one-line summary of a set change, e.g.
//
//	cidrset threats created: 1000000 prefixes (1000000 IPv4, 0 IPv6), 287ms (parse 48ms, agent 203ms: tables 96ms, files 14ms); dataplane 455.6 MiB for 1000000 prefixes (477.8 B/prefix)
//
// took is the whole command's time and parsed the part spent reading and parsing the
// list (0: none); the agent's part and its main stages come from res.Timing.
func (a *app) printChange(res api.CIDRSetChange, took, parsed time.Duration) {
	s := res.Set
	var b strings.Builder
	fmt.Fprintf(&b, "cidrset %s %s: %d prefixes (%d IPv4, %d IPv6)", s.Name, res.Action, s.Prefixes, s.IPv4, s.IPv6)
	switch {
	case res.Action == "changed":
		fmt.Fprintf(&b, ", %d added, %d removed", res.Added, res.Removed)
		if res.NotFound > 0 {
			fmt.Fprintf(&b, ", %d not in the set", res.NotFound)
		}
		if res.InPlace {
			b.WriteString(", in place")
		} else {
			b.WriteString(", rebuilt")
		}
	case res.Action == "replaced":
		fmt.Fprintf(&b, ", %d added, %d removed", res.Added, res.Removed)
	}
	if res.Duplicates > 0 {
		fmt.Fprintf(&b, ", %d duplicates", res.Duplicates)
	}
	if took > 0 {
		fmt.Fprintf(&b, ", %s", round(took))
		var parts []string
		if parsed > 0 {
			parts = append(parts, "parse "+round(parsed))
		}
		if t := res.Timing; t != nil {
			agent := fmt.Sprintf("agent %s: tables %s, files %s", msString(t.TotalMs), msString(t.DataplaneMs), msString(t.PersistMs))
			if t.WaitMs >= 10 {
				agent += ", waited " + msString(t.WaitMs)
			}
			parts = append(parts, agent)
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
		}
	}
	if l := s.LastLoad; l != nil && res.Action != "unchanged" && !res.InPlace {
		fmt.Fprintf(&b, "; dataplane %s for %d prefixes (%.1f B/prefix%s)", bytesString(l.DataplaneBytes), l.TotalPrefixes, l.BytesPerPrefix, kernelPart(l))
	}
	a.printf("%s\n", b.String())
}

// kernelPart says what of a load's dataplane memory is in the kernel's tables, e.g.
// "; kernel tables 20.9 B/prefix" ("" from an agent that does not say).
func kernelPart(l *api.CIDRSetLoad) string {
	if l.KernelBytes == 0 {
		return ""
	}
	return fmt.Sprintf("; kernel tables %s, %.1f B/prefix", bytesString(l.KernelBytes), l.KernelBytesPerPrefix)
}

func (a *app) printCIDRSet(s api.CIDRSet) {
	w := tabwriter.NewWriter(a.io.Out, 0, 4, 1, ' ', 0)
	fmt.Fprintf(w, "Name:\t%s\n", s.Name)
	fmt.Fprintf(w, "Index:\t%d (identity %d)\n", s.Index, s.Identity)
	fmt.Fprintf(w, "Source:\t%s\n", s.Source)
	fmt.Fprintf(w, "Loaded:\t%s\n", s.LoadedAt.Local().Format(time.RFC3339))
	if !s.ChangedAt.Equal(s.LoadedAt) {
		fmt.Fprintf(w, "Changed:\t%s\n", s.ChangedAt.Local().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "Prefixes:\t%d (IPv4 %d, IPv6 %d)\n", s.Prefixes, s.IPv4, s.IPv6)
	fmt.Fprintf(w, "By length:\t%s\n", lengthString(s.ByLength))
	fmt.Fprintf(w, "Agent memory:\t%s\n", bytesString(s.AgentBytes))
	if l := s.LastLoad; l != nil {
		fmt.Fprintf(w, "Dataplane:\t%s for %d prefixes of all sets (%.1f B/prefix%s), %d host entries\n", bytesString(l.DataplaneBytes), l.TotalPrefixes, l.BytesPerPrefix, kernelPart(l), l.HostEntries)
		fmt.Fprintf(w, "Last load:\t%.0f ms (agent %.0f ms, build %.0f ms, write %.0f ms)\n", l.TotalMs, l.AgentMs, l.BuildMs, l.WriteMs)
	}
	refs := strings.Join(s.ReferencedBy, ", ")
	if refs == "" {
		refs = "none"
	}
	fmt.Fprintf(w, "Policies:\t%s\n", refs)
	w.Flush()
}

// lengthString renders per-length counts, IPv4 then IPv6, shortest first: "v4/24:10 v4/32:90".
func lengthString(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		var fi, fj string
		var bi, bj int
		fmt.Sscanf(strings.Replace(keys[i], "/", " ", 1), "%s %d", &fi, &bi)
		fmt.Sscanf(strings.Replace(keys[j], "/", " ", 1), "%s %d", &fj, &bj)
		if fi != fj {
			return fi < fj
		}
		return bi < bj
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func bytesString(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func msString(ms float64) string { return round(time.Duration(ms * float64(time.Millisecond))) }

func round(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond).String() // "0s" would hide a fast step
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// progress draws a progress bar on stderr while a list loads, only if stderr is a
// terminal (scripts and logs get the summary line alone).
type progress struct {
	done   atomic.Int64
	total  int64
	label  string
	text   atomic.Pointer[string]
	out    io.Writer
	quit   chan struct{}
	closed atomic.Bool
	ended  chan struct{}
}

func (a *app) newProgress(label string, total int64) *progress {
	p := &progress{total: total, label: label, out: a.io.Err, quit: make(chan struct{}), ended: make(chan struct{})}
	if !isTerminal(a.io.Err) {
		close(p.ended)
		p.closed.Store(true)
		return p
	}
	go p.run()
	return p
}

func (p *progress) phase(s string) { p.text.Store(&s) }

func (p *progress) run() {
	defer close(p.ended)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	spin := `-\|/`
	for i := 0; ; i++ {
		select {
		case <-p.quit:
			fmt.Fprint(p.out, "\r\033[K")
			return
		case <-t.C:
		}
		el := time.Since(start).Truncate(100 * time.Millisecond)
		if s := p.text.Load(); s != nil {
			fmt.Fprintf(p.out, "\r\033[K%s: %s %c %s", p.label, *s, spin[i%4], el)
			continue
		}
		frac := 1.0
		if p.total > 0 {
			frac = float64(p.done.Load()) / float64(p.total)
		}
		const width = 30
		n := int(frac * width)
		fmt.Fprintf(p.out, "\r\033[K%s: parsing [%s%s] %3.0f%% %s", p.label, strings.Repeat("#", n), strings.Repeat(" ", width-n), 100*frac, el)
	}
}

func (p *progress) stop() {
	if p.closed.CompareAndSwap(false, true) {
		close(p.quit)
	}
	<-p.ended
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
