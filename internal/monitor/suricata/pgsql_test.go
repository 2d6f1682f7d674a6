package suricata_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/testenv"
)

// postgres is a PostgreSQL server (Debian's package) of a test, run as the postgres user
// inside a network namespace, logging every statement it executes.
type postgres struct {
	dir string
	log string
}

// startPostgres initialises a throwaway cluster (trust authentication) and starts it in ns
// listening on addr:5432; it stops with the test.
func startPostgres(t *testing.T, ns string, addr netip.Addr) *postgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		testenv.SkipOrFail(t, "PostgreSQL not installed (apt postgresql; scripts/setup.sh)")
	}
	if _, err := exec.LookPath("psql"); err != nil {
		testenv.SkipOrFail(t, "psql not installed (apt postgresql-client; scripts/setup.sh)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	u, err := user.Lookup("postgres")
	if err != nil {
		testenv.SkipOrFail(t, "no postgres user (apt postgresql): %v", err)
	}
	// The server refuses to run as root: its directory belongs to the postgres user, in
	// /tmp, which that user can reach (a test's TempDir is private to root).
	dir, err := os.MkdirTemp("", "rampart-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	asPostgres := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "--auth=trust", "-U", "postgres", "--no-sync")
	initdb.SysProcAttr = asPostgres
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// initdb lets in local clients only; the test's clients come from 198.18.0.0/15.
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = hba.WriteString("host all all 198.18.0.0/15 trust\n")
		hba.Close()
	}
	if err != nil {
		t.Fatalf("pg_hba.conf: %v", err)
	}
	p := &postgres{dir: dir, log: filepath.Join(dir, "postgres.log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// nsenter enters the namespace as root, then becomes the postgres user.
	cmd := exec.Command("nsenter", "--net="+ns, "--setuid", u.Uid, "--setgid", u.Gid, "--",
		filepath.Join(bin, "postgres"), "-D", data, "-p", "5432",
		"-c", "listen_addresses="+addr.String(), "-c", "unix_socket_directories="+dir,
		"-c", "log_statement=all", "-c", "fsync=off")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting postgres: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// SIGINT: PostgreSQL's fast shutdown (ends sessions, then exits).
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	if !testenv.Eventually(20*time.Second, func() bool {
		c, err := testenv.Dial(ns, "tcp", netip.AddrPortFrom(addr, 5432), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		b, _ := os.ReadFile(p.log)
		t.Fatalf("postgres did not listen on %s:5432:\n%s", addr, b)
	}
	return p
}

// executed reports whether the server's statement log shows stmt.
func (p *postgres) executed(stmt string) bool {
	b, _ := os.ReadFile(p.log)
	return strings.Contains(string(b), "statement: "+stmt)
}

// psql runs one session of psql from ns against host, one -c per statement, and returns its
// output; timeout kills a session that hangs (its connection dropped on the way).
func psql(ns string, host netip.Addr, timeout time.Duration, stmts ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := []string{"--net=" + ns, "--", "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
		fmt.Sprintf("host=%s port=5432 user=postgres dbname=postgres sslmode=disable connect_timeout=3", host)}
	for _, s := range stmts {
		args = append(args, "-c", s)
	}
	out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	return string(out), err
}

// The DVD rental demo's request-specific policy on a real database: user-create may
// insert a user but may not query one. An inline monitor between the service and
// PostgreSQL parses the pgsql protocol (EVE pgsql records show each query and its
// completion); the INSERT passes, the SELECT on users is dropped before the server runs
// it.
func TestIPSPgSQL(t *testing.T) {
	requireSuricata(t)
	nsA, nsB, nsM, in, out := ipsPath(t, "rsp", 12)
	db := netip.MustParseAddr("198.18.12.2")
	// The readiness check connects from the server's own namespace, over its loopback.
	sh(t, nsB, "ip", "link", "set", "lo", "up")

	m := startMonitor(t, suricata.Config{
		Mode: suricata.IPS, Netns: nsM, Interface: in, PeerInterface: out, Dir: t.TempDir(),
		Rules: []string{
			`drop pgsql any any -> any any (msg:"user-create may not query users"; flow:to_server,established; content:"select"; nocase; content:"users"; nocase; distance:0; sid:1000010; rev:1;)`,
		},
	})
	// PostgreSQL starts behind the monitor: the server's own start does not depend on it,
	// but the client reaches it only through it.
	pg := startPostgres(t, nsB, db)

	create := "CREATE TABLE users (id serial PRIMARY KEY, name text)"
	insert := "INSERT INTO users (name) VALUES ('alice')"
	if out, err := psql(nsA, db, 15*time.Second, create, insert); err != nil {
		t.Fatalf("create and insert through the monitor: %v\n%s", err, out)
	}
	if !pg.executed(insert) {
		t.Fatal("the server's log does not show the INSERT")
	}
	query := "SELECT name FROM users"
	out, err := psql(nsA, db, 5*time.Second, query)
	if err == nil || strings.Contains(out, "alice") {
		t.Fatalf("the query on users went through the monitor: err %v, output %q", err, out)
	}
	if pg.executed(query) {
		t.Fatal("the server executed the query on users")
	}

	var pgsqls []suricata.Event
	alert, seen := waitEvent(t, m, 10*time.Second, "alert on the query", func(ev suricata.Event) bool {
		if ev.Type == suricata.TypePgSQL {
			pgsqls = append(pgsqls, ev)
		}
		return ev.Type == suricata.TypeAlert
	})
	if alert.Alert.SignatureID != 1000010 || alert.Alert.Action != suricata.Blocked || alert.Tuple.Dst != netip.AddrPortFrom(db, 5432) {
		t.Errorf("alert %s, want sid 1000010 blocked towards %s:5432", alert, db)
	}
	if alert.AppProto != "pgsql" || alert.PgSQL == nil || alert.PgSQL.SimpleQuery != query {
		t.Errorf("alert %s: want app_proto pgsql and the query %q", alert, query)
	}
	isInsert := func(ev suricata.Event) bool {
		return ev.Type == suricata.TypePgSQL && ev.PgSQL.SimpleQuery == insert && ev.PgSQL.CommandCompleted == "INSERT 0 1"
	}
	inserted := false
	for _, ev := range pgsqls {
		inserted = inserted || isInsert(ev)
	}
	if !inserted {
		// Written when its transaction completed; read here if it came after the alert.
		_, more := waitEvent(t, m, 10*time.Second, "pgsql record of the INSERT with its completion", isInsert)
		seen = append(seen, more...)
	}
	for _, ev := range seen {
		if ev.Type == suricata.TypePgSQL {
			t.Logf("pgsql: %s %s", ev, ev.Raw)
			if strings.Contains(ev.PgSQL.SimpleQuery, "SELECT") && ev.PgSQL.CommandCompleted != "" {
				t.Errorf("a pgsql record shows the dropped query completed: %s", ev)
			}
		}
	}
}
