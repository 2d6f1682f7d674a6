package cli_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// echo sends a line on an established connection and checks it comes back.
func echo(t *testing.T, c net.Conn, r *bufio.Reader, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
		t.Fatalf("established connection: write %q: %v", msg, err)
	}
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != msg {
		t.Fatalf("established connection: read %q, %v; want %q", line, err, msg)
	}
}

// TestRestartKeepsEnforcementAndConnections stops the agent, shows that policy is still
// enforced and that an established allowed connection keeps working, restarts it and
// shows the same state and the same connection.
func TestRestartKeepsEnforcementAndConnections(t *testing.T) {
	e := setupXY(t)
	bIP := e.IP("y/b")
	e.MustCLI("apply", "-f", writeFile(t, "allow.yaml", allowXAtoB))

	conn, err := testenv.Dial(agenttest.NetnsPathOf(e.Config.Instance, "x", "a"), "tcp", netip.AddrPortFrom(bIP, 80), 2*time.Second)
	if err != nil {
		t.Fatalf("opening long connection x/a -> y/b:80: %v", err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	echo(t, conn, r, "before stop")

	snapshot := func() string {
		return e.MustCLI("endpoint", "list") + e.MustCLI("identity", "list") +
			e.MustCLI("get", "policies", "-o", "json") + e.MustCLI("namespace", "list")
	}
	before := snapshot()

	e.Stop()
	if _, _, code := e.CLI("status"); code == 0 {
		t.Fatal("status succeeded with the agent stopped")
	}
	// Enforcement continues without the agent.
	echo(t, conn, r, "while stopped")
	if e.Probe("x/c", bIP, 80, "tcp", probeTimeout) {
		t.Error("agent stopped: denied x/c -> y/b:80 passes")
	}
	if !e.Probe("x/a", bIP, 80, "tcp", 2*time.Second) {
		t.Error("agent stopped: allowed new x/a -> y/b:80 fails")
	}

	e.Start()
	echo(t, conn, r, "after restart")
	if after := snapshot(); after != before {
		t.Errorf("state changed across restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if e.Probe("x/c", bIP, 80, "tcp", probeTimeout) {
		t.Error("after restart: denied x/c -> y/b:80 passes")
	}
	if !e.Probe("x/a", bIP, 80, "tcp", 2*time.Second) {
		t.Error("after restart: allowed x/a -> y/b:80 fails")
	}
	// The restarted agent still applies changes.
	e.MustCLI("delete", "-f", writeFile(t, "allow.yaml", allowXAtoB))
	if !e.Probe("x/c", bIP, 80, "tcp", 2*time.Second) {
		t.Error("after restart and delete: x/c -> y/b:80 still blocked")
	}
	echo(t, conn, r, "after delete")
}

func TestSecondAgentRefusesSocket(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	cfg := e.Config
	cfg.Instance = "other" + testenv.Suffix(6)
	cfg.StateDir = t.TempDir()
	if a, err := newAgent(cfg); err == nil {
		a.Close()
		t.Fatal("a second agent started on a socket that answers")
	} else if !strings.Contains(err.Error(), "already") {
		t.Fatalf("unexpected error: %v", err)
	}
	if out := e.MustCLI("status"); !strings.Contains(out, e.Config.Instance) {
		t.Errorf("first agent disturbed: %s", out)
	}
}
