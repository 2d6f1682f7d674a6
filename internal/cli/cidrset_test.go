package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
)

// fakeSets is an agent that only knows CIDR sets, recording what it was sent.
type fakeSets struct {
	api.Service
	mu   sync.Mutex
	reqs []string // "load NAME source n", ...
	last api.PrefixList
}

func (f *fakeSets) record(op string, req api.CIDRSetRequest) api.CIDRSetChange {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, op+" "+req.Name+" "+req.Source)
	f.last = req.Prefixes
	l := api.PrefixList{V4: slices.Clone(req.Prefixes.V4), V6: slices.Clone(req.Prefixes.V6)}
	dups := l.Normalize()
	return api.CIDRSetChange{
		Action: map[string]string{"load": "created", "add": "changed", "remove": "changed"}[op], Given: req.Prefixes.Len(), Duplicates: dups,
		Added: l.Len(), InPlace: op != "load",
		Timing: &api.CIDRSetTiming{ReceiveMs: 1, DataplaneMs: 5, PersistMs: 3, WaitMs: 12.5, TotalMs: 21.5},
		Set: api.CIDRSet{Name: req.Name, Prefixes: l.Len(), IPv4: len(l.V4), IPv6: len(l.V6),
			LastLoad: &api.CIDRSetLoad{TotalPrefixes: l.Len(), DataplaneBytes: 3 << 20, BytesPerPrefix: float64(3<<20) / float64(max(1, l.Len()))}},
	}
}

func (f *fakeSets) LoadCIDRSet(_ context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return f.record("load", req), nil
}

func (f *fakeSets) AddCIDRs(_ context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return f.record("add", req), nil
}

func (f *fakeSets) RemoveCIDRs(_ context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return f.record("remove", req), nil
}

func (f *fakeSets) DeleteCIDRSet(_ context.Context, name string, force bool) (api.CIDRSetChange, error) {
	if !force {
		return api.CIDRSetChange{}, api.Conflict("CIDR set %q is named by [CiliumNetworkPolicy/x/block]", name)
	}
	return api.CIDRSetChange{Action: "deleted", Removed: 7}, nil
}

func (f *fakeSets) GetCIDRSet(_ context.Context, name string) (api.CIDRSet, error) {
	return api.CIDRSet{Name: name, Index: 3, Identity: 0x7FFFFF03, Source: "file t.txt", Prefixes: 3, IPv4: 2, IPv6: 1,
		ByLength: map[string]int{"v4/8": 1, "v4/32": 1, "v6/32": 1}, AgentBytes: 48, ReferencedBy: []string{"CiliumNetworkPolicy/x/block"},
		LastLoad: &api.CIDRSetLoad{TotalPrefixes: 3, DataplaneBytes: 1 << 20, BytesPerPrefix: 349525.3, KernelBytes: 3 << 18, KernelBytesPerPrefix: 262144, TotalMs: 12}}, nil
}

func (f *fakeSets) ListCIDRSets(context.Context) ([]api.CIDRSet, error) {
	return []api.CIDRSet{{Name: "threats", Index: 0, Prefixes: 2, IPv4: 2, Source: "file t.txt"}}, nil
}

// runFake runs the CLI against a fake agent and returns stdout, stderr and the exit code.
func runFake(t *testing.T, svc api.Service, stdin string, args ...string) (string, string, int) {
	t.Helper()
	sock := serveFake(t, svc)
	var out, errOut bytes.Buffer
	code := Run(context.Background(), append([]string{"--socket", sock}, args...), IO{In: strings.NewReader(stdin), Out: &out, Err: &errOut})
	return out.String(), errOut.String(), code
}

// serveFake serves svc's API on a socket of its own until the test ends.
func serveFake(t *testing.T, svc api.Service) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rp-cli-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	l, err := api.Listen(sock)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, l, api.NewHandler(svc)) }()
	t.Cleanup(func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	})
	return sock
}

func TestCIDRSetLoadCommand(t *testing.T) {
	f := &fakeSets{}
	list := filepath.Join(t.TempDir(), "threats.txt")
	os.WriteFile(list, []byte("# threats\n203.0.113.0/24\r\n198.51.100.7\n\n2001:db8::/32 # v6\n198.51.100.7/32\n"), 0o644)
	out, errOut, code := runFake(t, f, "", "cidrset", "load", "threats", "--file", list)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if len(f.reqs) != 1 || f.reqs[0] != "load threats file "+list || f.last.Len() != 4 {
		t.Fatalf("agent got %v with %d prefixes", f.reqs, f.last.Len())
	}
	if !f.last.Contains(netip.MustParsePrefix("2001:db8::/32")) || f.last.V4[1] != api.V4Key(netip.MustParsePrefix("198.51.100.7/32")) {
		t.Fatalf("prefixes sent: %v", f.last.Prefixes())
	}
	// One summary line: prefixes, duplicates, time (and where it went), memory. No progress
	// bar off a terminal.
	if !strings.HasPrefix(out, "cidrset threats created: 3 prefixes (2 IPv4, 1 IPv6), 1 duplicates, ") ||
		!strings.Contains(out, " (parse ") || !strings.Contains(out, ", agent 22ms: tables 5ms, files 3ms, waited 13ms); ") ||
		!strings.Contains(out, "; dataplane 3.0 MiB for 3 prefixes (1048576.0 B/prefix)") || strings.Count(out, "\n") != 1 || errOut != "" {
		t.Fatalf("output %q, stderr %q", out, errOut)
	}
	// From stdin.
	if _, errOut, code := runFake(t, f, "10.0.0.0/8\n", "cidrset", "load", "s", "-f", "-", "--source", "feed"); code != 0 || f.reqs[1] != "load s feed" {
		t.Fatalf("stdin load: %d %s %v", code, errOut, f.reqs)
	}
}

func TestCIDRSetLoadBadLineSendsNothing(t *testing.T) {
	f := &fakeSets{}
	list := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(list, []byte("10.0.0.0/8\n# ok\n10.0.0.0/8 10.0.0.1\n"), 0o644)
	_, errOut, code := runFake(t, f, "", "cidrset", "load", "threats", "--file", list)
	if code != 1 || errOut != "Error: "+list+":3: unexpected text after \"10.0.0.0/8\" (one CIDR per line)\n" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if len(f.reqs) != 0 {
		t.Fatalf("agent was sent %v", f.reqs)
	}
	if _, errOut, code := runFake(t, f, "", "cidrset", "load", "threats"); code != 1 || !strings.Contains(errOut, "--file is required") {
		t.Fatalf("without --file: %d %q", code, errOut)
	}
	if _, errOut, code := runFake(t, f, "", "cidrset", "load", "threats", "-f", filepath.Join(t.TempDir(), "missing")); code != 1 || !strings.Contains(errOut, "reading list") {
		t.Fatalf("missing file: %d %q", code, errOut)
	}
}

func TestCIDRSetOtherCommands(t *testing.T) {
	f := &fakeSets{}
	out, errOut, code := runFake(t, f, "", "cidrset", "add", "threats", "192.0.2.1", "10.0.0.0/8")
	if code != 0 || out != "cidrset threats changed: 2 prefixes (2 IPv4, 0 IPv6), 2 added, 0 removed, in place\n" {
		t.Fatalf("add: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := runFake(t, f, "", "cidrset", "remove", "threats", "10.0.0.0/88"); code != 1 || !strings.Contains(errOut, `invalid CIDR "10.0.0.0/88"`) || len(f.reqs) != 1 {
		t.Fatalf("remove with a bad CIDR: %d %q, agent got %v", code, errOut, f.reqs)
	}
	out, _, code = runFake(t, f, "", "cidrset", "get", "threats")
	for _, want := range []string{"Index:        3 (identity 2147483395)", "Prefixes:     3 (IPv4 2, IPv6 1)", "By length:    v4/8:1 v4/32:1 v6/32:1",
		"Dataplane:    1.0 MiB for 3 prefixes of all sets (349525.3 B/prefix; kernel tables 768.0 KiB, 262144.0 B/prefix)", "Policies:     CiliumNetworkPolicy/x/block"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("get output lacks %q:\n%s", want, out)
		}
	}
	out, _, code = runFake(t, f, "", "cidrset", "list")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "threats") {
		t.Errorf("list: %q", out)
	}
	_, errOut, code = runFake(t, f, "", "cidrset", "delete", "threats")
	if code != 1 || !strings.Contains(errOut, "CiliumNetworkPolicy/x/block") {
		t.Errorf("delete without force: %d %q", code, errOut)
	}
	out, _, code = runFake(t, f, "", "cidrset", "delete", "threats", "--force")
	if code != 0 || out != "cidrset threats deleted (7 prefixes)\n" {
		t.Errorf("delete --force: %d %q", code, out)
	}
}

// slowSets answers loads after a while, so the progress bar has time to draw.
type slowSets struct{ fakeSets }

func (f *slowSets) LoadCIDRSet(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	time.Sleep(350 * time.Millisecond)
	return f.fakeSets.LoadCIDRSet(ctx, req)
}

// TestCIDRSetLoadProgressOnTerminal runs a load with stderr on a pseudo-terminal: the
// progress bar is drawn there (and erased at the end), the summary goes to stdout.
func TestCIDRSetLoadProgressOnTerminal(t *testing.T) {
	master, slave, err := openPTY()
	if err != nil {
		testenv.SkipOrFail(t, "no pseudo-terminal: %v", err)
	}
	defer master.Close()
	defer slave.Close()
	var screen bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			screen.Write(buf[:n])
			if err != nil || strings.Contains(screen.String(), "\r\033[K") && strings.HasSuffix(screen.String(), "\r\033[K") {
				return
			}
		}
	}()
	list := filepath.Join(t.TempDir(), "l.txt")
	os.WriteFile(list, []byte("10.0.0.0/8\n192.0.2.1\n"), 0o644)
	dir, _ := os.MkdirTemp("", "rp-cli-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	l, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, l, api.NewHandler(&slowSets{})) }()
	defer func() { cancel(); <-done }()
	var out bytes.Buffer
	code := Run(context.Background(), []string{"--socket", sock, "cidrset", "load", "s", "-f", list}, IO{In: strings.NewReader(""), Out: &out, Err: slave})
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	select {
	case <-read:
	case <-time.After(5 * time.Second):
		t.Fatal("no progress output on the terminal")
	}
	if s := screen.String(); !strings.Contains(s, "cidrset s: parsed 2 prefixes in ") || !strings.Contains(s, "; loading") || !strings.HasSuffix(s, "\r\033[K") {
		t.Fatalf("terminal output %q", s)
	}
	if !strings.HasPrefix(out.String(), "cidrset s created: 2 prefixes") {
		t.Fatalf("summary %q", out.String())
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY() (*os.File, *os.File, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}
