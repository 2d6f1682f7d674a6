package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// Filter names, in the order the report lists them.
const (
	FilterNone     = "none"
	FilterControl  = "control"
	FilterIptables = "iptables"
	FilterIpset    = "ipset"
	FilterNft      = "nftables"
	FilterLPM      = "tc-lpm"
	FilterEmptyTCX = "tcx-empty"
	// FilterAgentEmpty is opt-in like FilterEmptyTCX.
	FilterAgentEmpty = "agent-empty"
	FilterRampart    = "rampart"
)

// FilterNames are every filter the benchmark knows, baseline first.
var FilterNames = []string{FilterNone, FilterControl, FilterIptables, FilterIpset, FilterNft, FilterLPM, FilterRampart}

// filterDescriptions say what each filter is, for the report.
var filterDescriptions = map[string]string{
	FilterNone:       "no filter (baseline)",
	FilterControl:    "no filter on the peers' topology, paired with the baseline like a filter: an A/A control, whose ratios are what noise and the harness alone produce",
	FilterIptables:   "iptables, one DROP rule per prefix in the client's OUTPUT chain (-o eth0 -d PREFIX)",
	FilterIpset:      "ipset hash:net (maxelem sized to the list) matched by one iptables OUTPUT rule",
	FilterNft:        "nftables interval set matched by one rule in an output-hook chain",
	FilterLPM:        "tc-eBPF LPM trie on the client's eth0 egress (TCX), raw map BatchUpdate",
	FilterEmptyTCX:   "empty TCX programs where Rampart attaches its own (the client's host-side veth, ingress and egress): what the hooks alone cost; not among the default filters",
	FilterAgentEmpty: "Rampart's own agent and topology with the programs of its two TCX links swapped for empty ones while measured: everything of Rampart's path but the programs' work; not among the default filters",
	FilterRampart:    "Rampart: agent, CIDR set (rampart cidrset load) and a CiliumNetworkPolicy egressDeny toCIDRSet",
}

// Command is one set-up or removal command and what it cost.
type Command struct {
	Argv    string  `json:"argv"`
	Seconds float64 `json:"seconds"`
	// MaxRSSBytes is the command's peak resident memory (getrusage), user space only.
	MaxRSSBytes int64 `json:"max_rss_bytes,omitempty"`
	// UserSeconds and SystemSeconds are the CPU time the command used (getrusage): far
	// less than Seconds means it waited, on another process (the agent) or the machine.
	UserSeconds   float64 `json:"user_seconds,omitempty"`
	SystemSeconds float64 `json:"system_seconds,omitempty"`
	// Output is the end of what the command printed (Rampart's summary line says where
	// the load's time went).
	Output string `json:"output,omitempty"`
}

// outputTail is how much of a command's output a Command keeps.
const outputTail = 400

// install is what a filter's set-up reports.
type install struct {
	Commands []Command
	// Entries is what the filter says it holds after set-up (-1: not asked, because
	// listing it would cost more than the set-up).
	Entries int
	// Bytes is memory the filter reports for itself (0: it does not).
	Bytes int64
	// Report is what the filter says about itself after set-up, as JSON (Rampart's
	// `cidrset get -o json`: load timings, bytes per prefix), or nil.
	Report json.RawMessage
}

// filter is one way of blocking the list on the client's egress.
type filter interface {
	Name() string
	// Topology is where the filter's traffic runs.
	Topology() *topology
	// Prepare writes what the set-up command reads, from the list (a file of one prefix
	// per line at listPath), into dir. It is not timed: a user has the list at hand.
	Prepare(ctx context.Context, list List, listPath, dir string) error
	// Install runs the set-up; the caller times it until the listed address is blocked.
	Install(ctx context.Context) (install, error)
	// Remove takes the filter off and frees what it holds (also after a failed Install).
	Remove(ctx context.Context) error
	// Version names the tool and its version.
	Version(ctx context.Context) string
}

// runTimed runs a command (built with benchkit.OwnGroup), feeding it stdin from the file at
// stdinPath if not empty, and reports its duration and peak memory.
func runTimed(ctx context.Context, timeout time.Duration, stdinPath string, mk func(ctx context.Context) *exec.Cmd) (Command, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := mk(ctx)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if stdinPath != "" {
		f, err := os.Open(stdinPath)
		if err != nil {
			return Command{}, fmt.Errorf("opening %s: %w", stdinPath, err)
		}
		defer f.Close()
		cmd.Stdin = f
	}
	c := Command{Argv: strings.Join(cmd.Args, " ")}
	if stdinPath != "" {
		c.Argv += " < " + filepath.Base(stdinPath)
	}
	t0 := time.Now()
	err := cmd.Run()
	c.Seconds = time.Since(t0).Seconds()
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			c.MaxRSSBytes = ru.Maxrss * 1024
			c.UserSeconds = time.Duration(ru.Utime.Nano()).Seconds()
			c.SystemSeconds = time.Duration(ru.Stime.Nano()).Seconds()
		}
	}
	out := strings.TrimSpace(stderr.String())
	c.Output = out[max(0, len(out)-outputTail):]
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v", timeout)
		}
		return c, fmt.Errorf("%s: %w: %s", c.Argv, err, strings.TrimSpace(benchkit.Truncate(stderr.String(), 500)))
	}
	return c, nil
}

// version runs argv and returns its first output line.
func version(ctx context.Context, argv ...string) string {
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return benchkit.OwnGroup(exec.CommandContext(ctx, argv[0], argv[1:]...))
	})
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// family is what differs between IPv4 and IPv6 in the netfilter peers' commands.
type family struct {
	iptables string // the command: iptables or ip6tables
	ipset    string // hash:net family: inet or inet6
	nft      string // nftables table family and address match: ip or ip6
	nftType  string // nftables set element type
}

var (
	familyIPv4 = family{iptables: "iptables", ipset: "inet", nft: "ip", nftType: "ipv4_addr"}
	familyIPv6 = family{iptables: "ip6tables", ipset: "inet6", nft: "ip6", nftType: "ipv6_addr"}
)

// familyOf returns the family of a run over IPv6 (ipv6) or IPv4.
func familyOf(ipv6 bool) family {
	if ipv6 {
		return familyIPv6
	}
	return familyIPv4
}

// netfilterBase holds what the netfilter peers share: the client namespace they filter in,
// the address family and the iptables flavour.
type netfilterBase struct {
	topo *topology
	fam  family
	// iptables is "legacy" (x_tables, as in the original benchmark's iptables 1.6) or
	// "nft" (the nf_tables backend of iptables 1.8).
	iptables string
	timeout  time.Duration
	input    string // the prepared set-up file
}

func (b *netfilterBase) Topology() *topology { return b.topo }

// ipt is the iptables (or ip6tables) command of the flavour: iptables-legacy, ...
func (b *netfilterBase) ipt() string { return b.fam.iptables + "-" + b.iptables }

// run runs argv in the client namespace.
func (b *netfilterBase) run(ctx context.Context, stdinPath string, argv ...string) (Command, error) {
	return runTimed(ctx, b.timeout, stdinPath, func(ctx context.Context) *exec.Cmd {
		return b.topo.Client.Command(ctx, argv...)
	})
}

// flushOutput empties the client's OUTPUT chain (the namespace is the benchmark's own:
// nothing else lives there).
func (b *netfilterBase) flushOutput(ctx context.Context) error {
	_, err := b.run(ctx, "", b.ipt(), "-w", "-F", "OUTPUT")
	return err
}

// iptablesFilter: one rule per prefix, as the original benchmark's iptables filter.
type iptablesFilter struct {
	netfilterBase
	rules int
}

// xtRuleLimit is about how many rules of this shape fit in one x_tables table: the kernel
// refuses a table blob of 512 MiB or more (XT_MAX_TABLE_SIZE), and one rule with its
// address match and DROP target takes about 210 bytes (measured with 1M rules).
const xtRuleLimit = 2_500_000

func (f *iptablesFilter) Name() string { return FilterIptables }

func (f *iptablesFilter) Prepare(ctx context.Context, list List, _, dir string) error {
	f.input = filepath.Join(dir, "iptables-restore.txt")
	f.rules = list.Len()
	return writeFile(f.input, func(w io.Writer) error {
		if _, err := io.WriteString(w, "*filter\n"); err != nil {
			return err
		}
		if err := list.WriteLines(w, "-A OUTPUT -o eth0 -d ", " -j DROP\n"); err != nil {
			return err
		}
		_, err := io.WriteString(w, "COMMIT\n")
		return err
	})
}

func (f *iptablesFilter) Install(ctx context.Context) (install, error) {
	c, err := f.run(ctx, f.input, f.ipt()+"-restore", "-w")
	if err != nil && f.iptables == "legacy" && f.rules > xtRuleLimit {
		err = fmt.Errorf("%w (probably the x_tables table size limit, XT_MAX_TABLE_SIZE = 512 MiB: about %d rules of this shape)", err, xtRuleLimit)
	}
	return install{Commands: []Command{c}, Entries: -1}, err
}

func (f *iptablesFilter) Remove(ctx context.Context) error {
	defer os.Remove(f.input)
	return f.flushOutput(ctx)
}

func (f *iptablesFilter) Version(ctx context.Context) string {
	return version(ctx, f.ipt(), "--version")
}

// ipsetFilter: one hash:net set, matched by one iptables rule, as the original benchmark's
// ipset filter (and Calico's GlobalNetworkSet underneath).
type ipsetFilter struct{ netfilterBase }

// ipsetName is the set's name; sets are per network namespace, and the client namespace
// is the benchmark's own.
const ipsetName = "rpbench"

func (f *ipsetFilter) Name() string { return FilterIpset }

func (f *ipsetFilter) Prepare(ctx context.Context, list List, _, dir string) error {
	f.input = filepath.Join(dir, "ipset-restore.txt")
	return writeFile(f.input, func(w io.Writer) error {
		// maxelem defaults to 65536; the original benchmark set 2,000,000 for every size,
		// here it is the list's size so that 10M fits. The hash size is left to ipset, which
		// grows the table as the set fills.
		if _, err := fmt.Fprintf(w, "create %s hash:net family %s maxelem %d\n", ipsetName, f.fam.ipset, max(65536, list.Len())); err != nil {
			return err
		}
		return list.WriteLines(w, "add "+ipsetName+" ", "\n")
	})
}

func (f *ipsetFilter) Install(ctx context.Context) (install, error) {
	var in install
	c, err := f.run(ctx, "", "ipset", "restore", "-file", f.input)
	in.Commands = append(in.Commands, c)
	if err != nil {
		return in, err
	}
	c, err = f.run(ctx, "", f.ipt(), "-w", "-A", "OUTPUT", "-o", "eth0", "-m", "set", "--match-set", ipsetName, "dst", "-j", "DROP")
	in.Commands = append(in.Commands, c)
	if err != nil {
		return in, err
	}
	// Not timed: how many entries and how much memory ipset reports.
	out, err := benchkit.RunOutput(ctx, time.Minute, func(ctx context.Context) *exec.Cmd {
		return f.topo.Client.Command(ctx, "ipset", "list", "-terse", ipsetName)
	})
	if err != nil {
		return in, err
	}
	in.Entries, in.Bytes = parseIpsetList(string(out))
	return in, nil
}

// parseIpsetList reads "Number of entries: N" and "Size in memory: B" from `ipset list
// -terse` (-1 and 0 when missing).
func parseIpsetList(s string) (entries int, bytes int64) {
	entries = -1
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Number of entries":
			fmt.Sscan(v, &entries)
		case "Size in memory":
			fmt.Sscan(v, &bytes)
		}
	}
	return entries, bytes
}

func (f *ipsetFilter) Remove(ctx context.Context) error {
	defer os.Remove(f.input)
	err := f.flushOutput(ctx)
	if _, derr := f.run(ctx, "", "ipset", "destroy", ipsetName); derr != nil && !strings.Contains(derr.Error(), "does not exist") {
		err = errors.Join(err, derr)
	}
	return err
}

func (f *ipsetFilter) Version(ctx context.Context) string { return version(ctx, "ipset", "--version") }

// nftFilter: an interval set in a table of its own, matched by one rule on the output hook.
type nftFilter struct{ netfilterBase }

const nftTable = "rpbench"

func (f *nftFilter) Name() string { return FilterNft }

func (f *nftFilter) Prepare(ctx context.Context, list List, _, dir string) error {
	f.input = filepath.Join(dir, "nft.txt")
	return writeFile(f.input, func(w io.Writer) error {
		// The drawn prefixes never overlap, which an interval set without auto-merge
		// requires; the set holds exactly the list.
		if _, err := fmt.Fprintf(w, "table %s %s {\n\tset deny {\n\t\ttype %s\n\t\tflags interval\n\t\telements = {\n", f.fam.nft, nftTable, f.fam.nftType); err != nil {
			return err
		}
		if err := list.WriteLines(w, "\t\t\t", ",\n"); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "\t\t}\n\t}\n\tchain out {\n\t\ttype filter hook output priority filter; policy accept;\n\t\toifname \"eth0\" %s daddr @deny drop\n\t}\n}\n", f.fam.nft)
		return err
	})
}

func (f *nftFilter) Install(ctx context.Context) (install, error) {
	c, err := f.run(ctx, "", "nft", "-f", f.input)
	return install{Commands: []Command{c}, Entries: -1}, err
}

func (f *nftFilter) Remove(ctx context.Context) error {
	defer os.Remove(f.input)
	_, err := f.run(ctx, "", "nft", "delete", "table", f.fam.nft, nftTable)
	if err != nil && (strings.Contains(err.Error(), "No such file or directory") || strings.Contains(err.Error(), "does not exist")) {
		return nil
	}
	return err
}

func (f *nftFilter) Version(ctx context.Context) string { return version(ctx, "nft", "--version") }

// clientNetnsDo runs fn in the topology's client network namespace.
func clientNetnsDo(t *topology, fn func() error) error { return endpoint.Do(t.Client.Netns, fn) }

// controlFilter is no filter at all on the peers' topology: the A/A control. It is never
// set up; runFilter measures it directly.
type controlFilter struct{ topo *topology }

func (f *controlFilter) Name() string        { return FilterControl }
func (f *controlFilter) Topology() *topology { return f.topo }
func (f *controlFilter) Prepare(context.Context, List, string, string) error {
	return nil
}
func (f *controlFilter) Install(context.Context) (install, error) { return install{Entries: -1}, nil }
func (f *controlFilter) Remove(context.Context) error             { return nil }
func (f *controlFilter) Version(context.Context) string           { return "" }
