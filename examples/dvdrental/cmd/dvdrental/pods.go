package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
)

// The entrypoints of the cluster form's pods (examples/dvdrental/cluster/): one image,
// rampart.io/dvdrental (scripts/build-dvd-image.sh), holds this binary, PostgreSQL,
// mosquitto and Suricata, and each pod runs one of these subcommands.

// compromisedFile is where `dvdrental compromise` writes the mode a service started with
// --compromised-file reads.
const compromisedFile = "/tmp/compromised"

// runDB is the database pod: a PostgreSQL cluster made at the first start in --data (an
// emptyDir), plain text and trusting every address (the connection policy decides who
// reaches it, and a monitor must read the protocol), and the store's tables. It runs as
// the image's postgres user: PostgreSQL refuses to run as root.
func runDB(args []string) error {
	fs := flag.NewFlagSet("db", flag.ExitOnError)
	data := fs.String("data", "/data/pg", "the database cluster's directory")
	pgBin := fs.String("pg-bin", "/usr/lib/postgresql/15/bin", "PostgreSQL's server binaries")
	readyFile := fs.String("ready-file", "/tmp/db-ready", "written once the tables exist (the readiness probe's)")
	fs.Parse(args)
	fresh := false
	if _, err := os.Stat(filepath.Join(*data, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		fresh = true
		initdb := exec.Command(filepath.Join(*pgBin, "initdb"), "-D", *data, "-U", "dvd", "--auth=trust",
			"--locale=C", "--encoding=UTF8", "--no-sync")
		if out, err := initdb.CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %w: %s", err, out)
		}
		hba := "local all all trust\nhost all all 0.0.0.0/0 trust\n"
		if err := os.WriteFile(filepath.Join(*data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
			return fmt.Errorf("writing pg_hba.conf: %w", err)
		}
	}
	pg := exec.Command(filepath.Join(*pgBin, "postgres"), "-D", *data, "-c", "listen_addresses=*",
		"-c", fmt.Sprint("port=", pgPort), "-c", "unix_socket_directories="+*data, "-c", "fsync=off", "-c", "ssl=off", "-c", "jit=off")
	pg.Stdout, pg.Stderr = os.Stderr, os.Stderr
	if err := pg.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- pg.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(pgPort))
	if err := waitDial(addr, 30*time.Second, exited); err != nil {
		pg.Process.Signal(syscall.SIGTERM)
		return err
	}
	if fresh {
		if err := initDB([]string{"--db", addr}); err != nil {
			pg.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("creating the store's tables: %w", err)
		}
	}
	if err := os.WriteFile(*readyFile, nil, 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "db: ready")
	return forwardUntilExit(pg.Process, exited)
}

// waitDial polls addr until it accepts a connection, the process behind it exits, or
// timeout passes.
func waitDial(addr string, timeout time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("exited before listening on %s: %v", addr, werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %s: %w", addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a port that is not open yet
	}
}

// forwardUntilExit passes SIGTERM and SIGINT on to p and returns when it exits.
func forwardUntilExit(p *os.Process, exited <-chan error) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case s := <-sigs:
			p.Signal(s)
		case err := <-exited:
			return err
		}
	}
}

// runMQ is the message queue's pod: mosquitto on every address, anonymous, in memory.
func runMQ(args []string) error {
	fs := flag.NewFlagSet("mq", flag.ExitOnError)
	bin := fs.String("mosquitto", "/usr/sbin/mosquitto", "the broker")
	fs.Parse(args)
	conf := "/tmp/mosquitto.conf"
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listener %d 0.0.0.0\nallow_anonymous true\npersistence false\n", mqttPort)), 0o644); err != nil {
		return err
	}
	return syscall.Exec(*bin, []string{*bin, "-c", conf}, os.Environ())
}

// idle waits for SIGTERM: the customer's pod, where the driver runs the requests with
// kubectl exec.
func idle() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	return nil
}

// ready is the pods' readiness probe: tcp:ADDR accepts a connection, an http:// URL
// answers 2xx, file:PATH exists.
func ready(args []string) error {
	if len(args) != 1 {
		return errors.New("want one of tcp:ADDR, http://URL, file:PATH")
	}
	what := args[0]
	switch {
	case strings.HasPrefix(what, "tcp:"):
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(what, "tcp:"), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	case strings.HasPrefix(what, "http://"):
		resp, err := (&http.Client{Timeout: time.Second}).Get(what)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s: %s", what, resp.Status)
		}
		return nil
	case strings.HasPrefix(what, "file:"):
		_, err := os.Stat(strings.TrimPrefix(what, "file:"))
		return err
	}
	return fmt.Errorf("%q: want tcp:ADDR, http://URL or file:PATH", what)
}

// compromise sets the mode of the service in this pod (started with --compromised-file):
// what an attacker who took it over would make it do; no argument makes it honest again.
func compromise(args []string) error {
	mode := ""
	if len(args) > 0 {
		mode = args[0]
	}
	return os.WriteFile(compromisedFile, []byte(mode+"\n"), 0o644)
}

// A monitor pod's Suricata is driven through two files of its directory: monitor-ctl
// writes want.json and sends SIGHUP to the monitor process, which (re)starts or stops
// Suricata and writes state.json with the same generation. A pod's monitor endpoint is
// made with the pod (its tap interfaces), so the driver changes what runs on them without
// making the pod again: a new pod would be a new monitor, and stopping Suricata in a pod
// that stays is what shows an inline monitor failing closed.
type monitorWant struct {
	Gen   int      `json:"gen"`
	Mode  string   `json:"mode"` // off, passive, ips
	Rules []string `json:"rules,omitempty"`
	Lua   bool     `json:"lua,omitempty"` // the integrity script and Lua rules
}

type monitorState struct {
	Gen     int    `json:"gen"`
	Status  string `json:"status"` // off, running, or the error
	Dir     string `json:"dir,omitempty"`
	Startup string `json:"startup,omitempty"`
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// runMonitor is a monitor pod's process: Suricata on the pod's tap-rx (passive) or
// between tap-rx and tap-tx (IPS), configured by internal/monitor/suricata as the
// one-node demo's, each run in a directory of its own (gen-N) so that its EVE file holds
// that run's events only.
func runMonitor(args []string) error {
	fs := flag.NewFlagSet("monitor", flag.ExitOnError)
	dir := fs.String("dir", "/run/monitor", "the monitor's directory")
	lua := fs.String("lua-script", "/usr/share/dvdrental/integrity.lua", "the integrity Lua script")
	fs.Parse(args)
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(*dir, "state.json"), monitorState{Status: "off"}); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("monitor: waiting for monitor-ctl")
	var m *suricata.Monitor
	var exited <-chan struct{}
	stop := func() {
		if m != nil {
			m.Stop()
			m, exited = nil, nil
		}
	}
	defer stop()
	for {
		select {
		case <-exited:
			fmt.Println("monitor: Suricata exited")
			m, exited = nil, nil
			continue
		case s := <-sigs:
			if s != syscall.SIGHUP {
				return nil
			}
		}
		var want monitorWant
		if err := readJSON(filepath.Join(*dir, "want.json"), &want); err != nil {
			fmt.Println("monitor:", err)
			continue
		}
		stop()
		st := monitorState{Gen: want.Gen, Status: "off"}
		if want.Mode != "off" {
			cfg := suricata.Config{Interface: "tap-rx", PeerInterface: "tap-tx", Rules: want.Rules,
				Dir: filepath.Join(*dir, fmt.Sprintf("gen-%d", want.Gen))}
			switch want.Mode {
			case "passive":
				cfg.Mode = suricata.Passive
			case "ips":
				cfg.Mode = suricata.IPS
			}
			if want.Lua {
				cfg.LuaRules, cfg.LuaScripts = true, []string{*lua}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			var err error
			m, err = suricata.Start(ctx, cfg)
			cancel()
			if err != nil {
				st.Status = err.Error()
			} else {
				st.Status, st.Dir, st.Startup = "running", cfg.Dir, m.StartupTime().Round(time.Millisecond).String()
				exited = m.Exited()
			}
		}
		fmt.Printf("monitor: generation %d, %s %s\n", st.Gen, want.Mode, st.Status)
		if err := writeJSON(filepath.Join(*dir, "state.json"), st); err != nil {
			return err
		}
	}
}

type list []string

func (l *list) String() string     { return strings.Join(*l, "\n") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// monitorCtl asks the pod's monitor process for a mode and rules, and waits until it
// runs them (or says why not).
func monitorCtl(args []string) error {
	fs := flag.NewFlagSet("monitor-ctl", flag.ExitOnError)
	dir := fs.String("dir", "/run/monitor", "the monitor's directory")
	mode := fs.String("mode", "", "off, passive or ips")
	lua := fs.Bool("lua", false, "allow Lua rules, with the integrity script")
	timeout := fs.Duration("timeout", 45*time.Second, "how long to wait for Suricata")
	var rules list
	fs.Var(&rules, "rule", "a Suricata rule (repeatable)")
	fs.Parse(args)
	switch *mode {
	case "off", "passive", "ips":
	default:
		return fmt.Errorf("--mode %q: want off, passive or ips", *mode)
	}
	var prev monitorWant
	readJSON(filepath.Join(*dir, "want.json"), &prev) // none yet: generation 0
	want := monitorWant{Gen: prev.Gen + 1, Mode: *mode, Rules: rules, Lua: *lua}
	if err := writeJSON(filepath.Join(*dir, "want.json"), want); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(*dir, "pid"))
	if err != nil {
		return fmt.Errorf("the monitor process: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("the monitor process: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signalling the monitor process %d: %w", pid, err)
	}
	deadline := time.Now().Add(*timeout)
	for {
		var st monitorState
		if readJSON(filepath.Join(*dir, "state.json"), &st) == nil && st.Gen == want.Gen {
			if st.Status != "running" && st.Status != "off" {
				return errors.New(st.Status)
			}
			fmt.Printf("Suricata %s", st.Status)
			if st.Status == "running" {
				fmt.Printf(" (%s), started in %s", *mode, st.Startup)
			}
			fmt.Println()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the monitor did not take generation %d in %s", want.Gen, *timeout)
		}
		time.Sleep(50 * time.Millisecond) // polling the state the monitor process writes
	}
}

// waitAlert waits for an alert of the running Suricata with the rule's sid and action,
// and prints it: what the driver checks with kubectl exec in the monitor's pod.
func waitAlert(args []string) error {
	fs := flag.NewFlagSet("wait-alert", flag.ExitOnError)
	dir := fs.String("dir", "/run/monitor", "the monitor's directory")
	sid := fs.Int("sid", 0, "the rule's sid")
	action := fs.String("action", "", "allowed or blocked")
	timeout := fs.Duration("timeout", 15*time.Second, "how long to wait")
	fs.Parse(args)
	var st monitorState
	if err := readJSON(filepath.Join(*dir, "state.json"), &st); err != nil {
		return err
	}
	if st.Status != "running" {
		return fmt.Errorf("Suricata is %s", st.Status)
	}
	r := suricata.NewReader(filepath.Join(st.Dir, "eve.json"))
	deadline := time.Now().Add(*timeout)
	for {
		evs, err := r.Next()
		if err != nil {
			// A record it cannot parse is skipped; the reader goes on after it.
			fmt.Fprintln(os.Stderr, "wait-alert:", err)
		}
		for _, e := range evs {
			if e.Alert != nil && e.Alert.SignatureID == *sid && string(e.Alert.Action) == *action {
				fmt.Printf("%s %q on %s\n", e.Alert.Action, e.Alert.Signature, e.Tuple)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s alert of sid %d in %s", *action, *sid, *timeout)
		}
		time.Sleep(100 * time.Millisecond) // polling the EVE file Suricata appends to
	}
}
