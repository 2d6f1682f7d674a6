package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/netns"
)

// The store's endpoints: namespace dvd, label app=<name>; the customer in namespace
// customers.
var services = []string{"db", "mq", "user-update", "user-create", "shipping", "dvd-update", "contract-update", "dvd-return"}

const (
	storeNS    = "dvd"
	customerNS = "customers"
	httpPort   = 8080
	pgPort     = 5432
	mqttPort   = 1883
)

// demo is the driver of scripts/demo-dvdrental.sh: against a running agent it makes the
// store's endpoints, starts PostgreSQL, mosquitto and the services in them, applies the
// connection policy, plays the rental and the attacks, and checks every outcome.
type demo struct {
	api      *api.Client
	self     string // this binary
	work     string
	pgBin    string
	eps      map[string]api.Endpoint // by app
	customer api.Endpoint
	procs    map[string]*exec.Cmd // by endpoint (app)
	monitors []*suricata.Monitor
	rampart  string // the CLI, for the commands the demo shows
	lua      string // the integrity monitor's Lua script
	socket   string
	serving  map[string][]string // each service's serve arguments, for a restart
	failures int
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	socket := fs.String("socket", "", "the agent's API socket")
	work := fs.String("work", "", "work directory (database, broker configuration, logs)")
	pgBin := fs.String("pg-bin", "/usr/lib/postgresql/15/bin", "PostgreSQL's server binaries")
	examples := fs.String("examples", "examples/dvdrental", "the demo's manifests")
	rampart := fs.String("rampart", "", "the rampart CLI (default: next to this binary)")
	fs.Parse(args)
	if *socket == "" || *work == "" {
		return errors.New("--socket and --work are required")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *rampart == "" {
		*rampart = filepath.Join(filepath.Dir(self), "rampart")
	}
	d := &demo{api: api.NewClient(*socket), self: self, work: *work, pgBin: *pgBin, eps: map[string]api.Endpoint{},
		procs: map[string]*exec.Cmd{}, serving: map[string][]string{}, rampart: *rampart, socket: *socket}
	if d.lua, err = filepath.Abs(filepath.Join(*examples, "monitor", "integrity.lua")); err != nil {
		return err
	}
	defer d.api.Close()
	defer d.stop()
	ctx, stop := signalContext()
	defer stop()

	step("the store: endpoints, PostgreSQL, mosquitto and six services")
	if err := d.start(ctx); err != nil {
		return err
	}
	step("connection policy (examples/dvdrental/01-connection-policy.yaml)")
	if err := d.apply(ctx, filepath.Join(*examples, "01-connection-policy.yaml")); err != nil {
		return err
	}

	step("a rental: alice rents d1 at contract-update")
	d.expect("rental r1 accepted", d.customerDo(ctx, "rent", "contract-update", "r1", "alice", "d1") == nil, true)
	d.expect("alice billed for r1, nobody else", d.chargesFor(ctx, "r1") == "r1 alice 399", true)
	d.expect("d1 shipped to alice", d.waitShipped(ctx, "r1", "alice"), true)

	step("connection policy: a compromised shipping or dvd-return connects to the database")
	for _, from := range []string{"shipping", "dvd-return"} {
		code := d.probeDB(ctx, from)
		d.expect(from+" -> db:5432 blocked", code == 3, true)
	}
	d.expect("user-update -> db:5432 connects (control)", d.probeDB(ctx, "user-update") == 0, true)

	step("request integrity, no monitor: a compromised contract-update bills bob for alice's rental")
	if err := d.compromise(ctx, "contract-update", "bill-other"); err != nil {
		return err
	}
	d.expect("rental r2 accepted", d.customerDo(ctx, "rent", "contract-update", "r2", "alice", "d2") == nil, true)
	d.expect("bob billed for alice's r2: the attack goes unseen", d.chargesFor(ctx, "r2") == "r2 bob 399", true)
	if err := d.compromise(ctx, "contract-update", ""); err != nil {
		return err
	}

	step("request-specific connection policy, no monitor: a compromised user-create reads a customer's record")
	if err := d.compromise(ctx, "user-create", "read-user"); err != nil {
		return err
	}
	d.expect("carol created", d.customerDo(ctx, "create-user", "user-create", "", "carol", "") == nil, true)
	d.expect("user-create read alice's balance: the leak goes unseen", d.logContains("user-create.log", "read alice's balance"), true)

	step("monitors: dvd/ids-pg (PostgreSQL, inline) and dvd/ids-http (HTTP, passive), each running Suricata 7")
	pg, err := d.addMonitor(ctx, "ids-pg", "pgsql")
	if err != nil {
		return err
	}
	pgMon, err := d.runSuricata(ctx, pg, suricata.IPS, fmt.Sprintf(
		`drop tcp %s any -> %s %d (msg:"request-specific: user-create may insert customers, not read them"; flow:to_server,established; content:"SELECT"; nocase; sid:2000001; rev:1;)`,
		d.ip("user-create"), d.ip("db"), pgPort))
	if err != nil {
		return err
	}
	web, err := d.addMonitor(ctx, "ids-http", "http")
	if err != nil {
		return err
	}
	integrity := func(action string) string {
		return fmt.Sprintf(`%s http any any -> any %d (msg:"request integrity: a rental billed to another customer than the renter"; flow:to_server,established; lua:integrity.lua; sid:2000002; rev:1;)`, action, httpPort)
	}
	webMon, err := d.runSuricata(ctx, web, suricata.Passive, integrity("alert"))
	if err != nil {
		return err
	}
	policy := filepath.Join(*examples, "02-tap-policy.mg")
	step("tap policy (" + policy + "): what it derives, and why")
	if err := d.cli("tap", "compile", "-f", policy, "--explain"); err != nil {
		return err
	}
	if err := d.cli("tap", "policy", "apply", "-f", policy); err != nil {
		return err
	}

	step("request-specific connection policy, inline monitor: the compromised user-create inserts dave, its query is dropped")
	d.expect("dave's creation fails at the read", d.customerDo(ctx, "create-user", "user-create", "", "dave", "") != nil, true)
	d.expect("dave exists: the insert passed the monitor", strings.Contains(d.customers(ctx), "dave"), true)
	d.expect("the monitor dropped user-create's SELECT", d.waitAlert(ctx, pgMon, 2000001, suricata.Blocked), true)
	if err := d.compromise(ctx, "user-create", ""); err != nil {
		return err
	}
	d.expect("an honest rental through the PostgreSQL monitor: alice billed for r3",
		d.customerDo(ctx, "rent", "contract-update", "r3", "alice", "d3") == nil && d.chargesFor(ctx, "r3") == "r3 alice 399", true)

	step("request integrity, mirror: the compromised contract-update bills bob for alice's rental, the monitor sees it")
	if err := d.compromise(ctx, "contract-update", "bill-other"); err != nil {
		return err
	}
	d.expect("rental r4 accepted", d.customerDo(ctx, "rent", "contract-update", "r4", "alice", "d1") == nil, true)
	d.expect("bob billed for r4: a mirror only watches", d.chargesFor(ctx, "r4") == "r4 bob 399", true)
	d.expect("the monitor raised the integrity alert", d.waitAlert(ctx, webMon, 2000002, suricata.Allowed), true)

	inline := filepath.Join(*examples, "03-tap-policy-inline.mg")
	step("request integrity, inline (" + inline + "): the billing request for another customer is dropped")
	if err := d.stopMonitor(webMon); err != nil {
		return err
	}
	if webMon, err = d.runSuricata(ctx, web, suricata.IPS, integrity("drop")); err != nil {
		return err
	}
	if err := d.cli("tap", "policy", "apply", "-f", inline); err != nil {
		return err
	}
	d.expect("rental r5 refused: its billing never reached user-update", d.customerDo(ctx, "rent", "contract-update", "r5", "alice", "d2") != nil, true)
	d.expect("nobody billed for r5", d.chargesFor(ctx, "r5") == "", true)
	d.expect("the monitor dropped the billing request", d.waitAlert(ctx, webMon, 2000002, suricata.Blocked), true)
	if err := d.compromise(ctx, "contract-update", ""); err != nil {
		return err
	}
	d.expect("an honest rental through both inline monitors: alice billed for r6",
		d.customerDo(ctx, "rent", "contract-update", "r6", "alice", "d3") == nil && d.chargesFor(ctx, "r6") == "r6 alice 399", true)

	step("fail closed: the inline HTTP monitor stops")
	if err := d.stopMonitor(webMon); err != nil {
		return err
	}
	d.expect("rental r7 refused while its monitor is down: no way around it", d.customerDo(ctx, "rent", "contract-update", "r7", "alice", "d1") != nil, true)
	d.expect("nobody billed for r7", d.chargesFor(ctx, "r7") == "", true)
	if err := d.cli("tap", "list"); err != nil {
		return err
	}

	if d.failures > 0 {
		return fmt.Errorf("%d outcome(s) differ from what the policies say", d.failures)
	}
	fmt.Println("\nevery outcome as expected")
	return nil
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

// expect records an outcome against the one wanted.
func (d *demo) expect(what string, got, want bool) {
	if got == want {
		fmt.Printf("  ok    %s\n", what)
		return
	}
	d.failures++
	fmt.Printf("  FAIL  %s\n", what)
}

func (d *demo) ip(app string) string { return d.eps[app].IP }

func (d *demo) url(app string) string {
	return fmt.Sprintf("http://%s", net.JoinHostPort(d.ip(app), fmt.Sprint(httpPort)))
}

func (d *demo) start(ctx context.Context) error {
	for _, app := range services {
		ep, err := d.api.AddEndpoint(ctx, api.EndpointSpec{Namespace: storeNS, Name: app, Labels: map[string]string{"app": app}})
		if err != nil {
			return fmt.Errorf("endpoint %s/%s: %w", storeNS, app, err)
		}
		d.eps[app] = ep
		fmt.Printf("  endpoint %s/%s %s\n", storeNS, app, ep.IP)
	}
	c, err := d.api.AddEndpoint(ctx, api.EndpointSpec{Namespace: customerNS, Name: "customer", Labels: map[string]string{"app": "customer"}})
	if err != nil {
		return fmt.Errorf("endpoint %s/customer: %w", customerNS, err)
	}
	d.customer = c

	// PostgreSQL: its own cluster in the work directory, owned by the postgres user (it
	// refuses to run as root), trusting the store's addresses; plain text, so that a
	// monitor can read the protocol.
	pgdata := filepath.Join(d.work, "pgdata")
	if err := os.MkdirAll(pgdata, 0o700); err != nil {
		return err
	}
	if out, err := exec.Command("chown", "postgres:postgres", d.work, pgdata).CombinedOutput(); err != nil {
		return fmt.Errorf("chown: %v: %s", err, out)
	}
	initdb := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(d.pgBin, "initdb"), "-D", pgdata, "-U", "dvd", "--auth=trust")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	hba := fmt.Sprintf("host all all %s/32 trust\n", d.ip("db"))
	for _, app := range services {
		hba += fmt.Sprintf("host all all %s/32 trust\n", d.ip(app))
	}
	if err := os.WriteFile(filepath.Join(pgdata, "pg_hba.conf"), []byte("local all all trust\n"+hba), 0o600); err != nil {
		return err
	}
	exec.Command("chown", "postgres:postgres", filepath.Join(pgdata, "pg_hba.conf")).Run()
	if err := d.run("db", "postgres.log", "runuser", "-u", "postgres", "--", filepath.Join(d.pgBin, "postgres"), "-D", pgdata,
		"-c", "listen_addresses="+d.ip("db"), "-c", fmt.Sprint("port=", pgPort), "-c", "unix_socket_directories="+d.work,
		"-c", "fsync=off", "-c", "ssl=off"); err != nil {
		return err
	}
	if err := d.waitListening(ctx, "db", pgPort); err != nil {
		return err
	}
	dbAddr := net.JoinHostPort(d.ip("db"), fmt.Sprint(pgPort))
	if out, err := d.inEndpoint(ctx, "db", d.self, "initdb", "--db", dbAddr).CombinedOutput(); err != nil {
		return fmt.Errorf("creating the store's tables: %v: %s", err, out)
	}

	conf := filepath.Join(d.work, "mosquitto.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listener %d %s\nallow_anonymous true\npersistence false\n", mqttPort, d.ip("mq"))), 0o644); err != nil {
		return err
	}
	if err := d.run("mq", "mosquitto.log", "mosquitto", "-c", conf); err != nil {
		return err
	}
	if err := d.waitListening(ctx, "mq", mqttPort); err != nil {
		return err
	}

	mq := net.JoinHostPort(d.ip("mq"), fmt.Sprint(mqttPort))
	for _, s := range []struct {
		app  string
		args []string
	}{
		{"user-update", []string{"--db", dbAddr}},
		{"user-create", []string{"--db", dbAddr}},
		{"shipping", []string{"--record", filepath.Join(d.work, "shipments.jsonl")}},
		{"dvd-update", []string{"--db", dbAddr, "--mqtt", mq, "--shipping", d.url("shipping")}},
		{"contract-update", []string{"--mqtt", mq, "--user-update", d.url("user-update")}},
		{"dvd-return", []string{"--mqtt", mq}},
	} {
		d.serving[s.app] = append([]string{"serve", s.app, "--listen", net.JoinHostPort(d.ip(s.app), fmt.Sprint(httpPort))}, s.args...)
		if err := d.serve(ctx, s.app); err != nil {
			return err
		}
	}
	return nil
}

// serve starts service app with its arguments and extra ones, and waits until it listens.
func (d *demo) serve(ctx context.Context, app string, extra ...string) error {
	if err := d.run(app, app+".log", append(append([]string{d.self}, d.serving[app]...), extra...)...); err != nil {
		return err
	}
	return d.waitListening(ctx, app, httpPort)
}

// compromise restarts service app as the attacker runs it (--compromised mode), or as
// built when mode is empty.
func (d *demo) compromise(ctx context.Context, app, mode string) error {
	d.stopOne(app)
	if mode == "" {
		return d.serve(ctx, app)
	}
	return d.serve(ctx, app, "--compromised", mode)
}

// inEndpoint is a command run in app's network namespace (only the network namespace:
// the process sees the host's files).
func (d *demo) inEndpoint(ctx context.Context, app string, argv ...string) *exec.Cmd {
	ns := d.eps[app].Netns
	if app == "customer" {
		ns = d.customer.Netns
	}
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns, "--"}, argv...)...)
}

// run starts a long-running process in app's endpoint, its output appended to a log in
// the work directory; stop ends it.
func (d *demo) run(app, log string, argv ...string) error {
	f, err := os.OpenFile(filepath.Join(d.work, log), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + d.eps[app].Netns, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s in %s: %w", argv[0], app, err)
	}
	d.procs[app] = cmd
	return nil
}

// stopOne ends app's process group: SIGTERM, then SIGKILL after 5 s.
func (d *demo) stopOne(app string) {
	p, ok := d.procs[app]
	if !ok {
		return
	}
	delete(d.procs, app)
	syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

func (d *demo) stop() {
	for _, m := range d.monitors {
		m.Stop()
	}
	for app := range d.procs {
		d.stopOne(app)
	}
}

// waitListening polls, from inside app's endpoint, until its port accepts connections
// (before any policy, or allowed by it: a connection to its own address stays in its
// namespace).
func (d *demo) waitListening(ctx context.Context, app string, port int) error {
	addr := net.JoinHostPort(d.ip(app), fmt.Sprint(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var derr error
		err := netns.Do(d.eps[app].Netns, func() error {
			c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
			if err == nil {
				c.Close()
			}
			derr = err
			return nil
		})
		if err != nil {
			return err
		}
		if derr == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not listen on %s after 30 s: %v (logs in %s)", app, addr, derr, d.work)
		}
		time.Sleep(50 * time.Millisecond) // polling a port that is not open yet
	}
}

func (d *demo) apply(ctx context.Context, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	res, err := d.api.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: file, Data: string(b)}}})
	if err != nil {
		return fmt.Errorf("applying %s: %w", file, err)
	}
	fmt.Printf("  applied %s: %d change(s)\n", filepath.Base(file), len(res.Changes))
	return nil
}

// customerDo sends a customer's request (rent, return) to a store service.
func (d *demo) customerDo(ctx context.Context, what, app, rental, user, dvd string) error {
	out, err := d.inEndpoint(ctx, "customer", d.self, what, "--url", d.url(app), "--rental", rental, "--user", user, "--dvd", dvd).CombinedOutput()
	if err != nil {
		fmt.Printf("        %s\n", strings.TrimSpace(string(out)))
	}
	return err
}

// chargesFor reads the charges of rental from the database, from user-update's endpoint
// (the policy lets it reach the database).
func (d *demo) chargesFor(ctx context.Context, rental string) string {
	out, err := d.inEndpoint(ctx, "user-update", d.self, "charges", "--db", net.JoinHostPort(d.ip("db"), fmt.Sprint(pgPort))).Output()
	if err != nil {
		return "error: " + err.Error()
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, rental+" ") {
			lines = append(lines, l)
		}
	}
	fmt.Printf("        charges of %s: %q\n", rental, lines)
	return strings.Join(lines, "; ")
}

// waitShipped polls shipping's record until rental appears for user (the queue is
// asynchronous), for up to 10 s.
func (d *demo) waitShipped(ctx context.Context, rental, user string) bool {
	want := fmt.Sprintf(`"rental":%q,"user":%q`, rental, user)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b, _ := os.ReadFile(filepath.Join(d.work, "shipments.jsonl"))
		if strings.Contains(string(b), want) {
			return true
		}
		time.Sleep(50 * time.Millisecond) // polling a file another process appends to
	}
	return false
}

// probeDB runs what a compromised service would: a direct database connection from its
// endpoint. 0: connected and read; 3: no connection.
func (d *demo) probeDB(ctx context.Context, from string) int {
	cmd := d.inEndpoint(ctx, from, d.self, "probe-db", "--db", net.JoinHostPort(d.ip("db"), fmt.Sprint(pgPort)), "--timeout", "1s")
	out, _ := cmd.CombinedOutput()
	fmt.Printf("        %s: %s\n", from, strings.TrimSpace(string(out)))
	if cmd.ProcessState == nil {
		return -1
	}
	return cmd.ProcessState.ExitCode()
}

// logContains says whether a log of the work directory contains s.
func (d *demo) logContains(log, s string) bool {
	b, _ := os.ReadFile(filepath.Join(d.work, log))
	return strings.Contains(string(b), s)
}

// customers lists the customers, read from user-update's endpoint.
func (d *demo) customers(ctx context.Context) string {
	out, err := d.inEndpoint(ctx, "user-update", d.self, "customers", "--db", net.JoinHostPort(d.ip("db"), fmt.Sprint(pgPort))).Output()
	if err != nil {
		return "error: " + err.Error()
	}
	fmt.Printf("        customers: %s\n", strings.Join(strings.Fields(string(out)), ", "))
	return string(out)
}

// addMonitor makes monitor endpoint dvd/name, labelled with what it inspects.
func (d *demo) addMonitor(ctx context.Context, name string, inspects ...string) (api.Endpoint, error) {
	labels := map[string]string{"role": "monitor"}
	for _, w := range inspects {
		labels["inspects.rampart.io/"+w] = "true"
	}
	ep, err := d.api.AddEndpoint(ctx, api.EndpointSpec{Namespace: storeNS, Name: name, Labels: labels, Monitor: true})
	if err != nil {
		return ep, fmt.Errorf("monitor endpoint %s/%s: %w", storeNS, name, err)
	}
	fmt.Printf("  monitor endpoint %s/%s (inspects %s)\n", storeNS, name, strings.Join(inspects, ", "))
	return ep, nil
}

// runSuricata runs Suricata in monitor ep: passive on its receive interface, or inline
// between its receive and return interfaces. It stops with the demo.
func (d *demo) runSuricata(ctx context.Context, ep api.Endpoint, mode suricata.Mode, rules ...string) (*suricata.Monitor, error) {
	cfg := suricata.Config{Mode: mode, Netns: ep.Netns, Interface: "tap-rx", PeerInterface: "tap-tx",
		Dir: filepath.Join(d.work, fmt.Sprintf("suricata-%s-%d", ep.Name, len(d.monitors))), Rules: rules}
	if strings.Contains(strings.Join(rules, "\n"), "lua:") {
		cfg.LuaRules = true
		cfg.LuaScripts = []string{d.lua}
	}
	m, err := suricata.Start(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("Suricata in %s: %w", ep.Name, err)
	}
	d.monitors = append(d.monitors, m)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := d.api.WaitMonitorReading(wctx, ep.Key()); err != nil {
		return nil, fmt.Errorf("Suricata in %s: %w", ep.Name, err)
	}
	fmt.Printf("  Suricata %s in %s/%s, started in %v\n", mode, ep.Namespace, ep.Name, m.StartupTime().Round(time.Millisecond))
	return m, nil
}

// stopMonitor stops a monitor's Suricata.
func (d *demo) stopMonitor(m *suricata.Monitor) error {
	if err := m.Stop(); err != nil {
		return fmt.Errorf("stopping Suricata: %w", err)
	}
	fmt.Printf("  Suricata in %s stopped\n", m.Dir())
	return nil
}

// waitAlert waits up to 15 s for the monitor's alert sid with action, and prints it.
func (d *demo) waitAlert(ctx context.Context, m *suricata.Monitor, sid int, action suricata.Action) bool {
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ev, _, err := m.WaitEvent(wctx, func(e suricata.Event) bool {
		return e.Alert != nil && e.Alert.SignatureID == sid && e.Alert.Action == action
	})
	if err != nil {
		return false
	}
	fmt.Printf("        monitor: %s %q on %s\n", ev.Alert.Action, ev.Alert.Signature, ev.Tuple)
	return true
}

// cli runs the rampart CLI against the agent, showing the command and its output.
func (d *demo) cli(args ...string) error {
	fmt.Printf("\n$ rampart %s\n", strings.Join(args, " "))
	cmd := exec.Command(d.rampart, append([]string{"--socket", d.socket}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rampart %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
