package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/bench/l7"
)

// relayMain runs one path until SIGTERM: a relay from --listen to --upstream (user,
// splice, sockmap), or the client-side verdict (skmsg). It prints "ready ADDRESS" (the
// relay's; skmsg: the server's) on stdout once it is in place.
func relayMain(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	mode := fs.String("mode", "user", "user | splice | sockmap | skmsg")
	program := fs.String("program", "request", "skmsg: the sk_msg program of msg.bpf.o (request, request_parsed)")
	listen := fs.String("listen", "127.0.0.1:0", "relay address")
	upstream := fs.String("upstream", "", "server address")
	obj := fs.String("obj", "", "BPF object (sockmap: relay.bpf.o; skmsg: msg.bpf.o)")
	cgroup := fs.String("cgroup", "", "cgroup v2 root (skmsg; default: the first cgroup2 mount)")
	fs.Parse(args)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if *mode == "skmsg" {
		port, err := netip.ParseAddrPort(*upstream)
		if err != nil {
			return fmt.Errorf("--upstream: %w", err)
		}
		if *cgroup == "" {
			if *cgroup, err = cgroup2Mount(); err != nil {
				return err
			}
		}
		return clientVerdict(*obj, *program, *cgroup, port, stop)
	}
	var socks, peers *ebpf.Map
	if *mode == "sockmap" {
		coll, err := loadObject(*obj, nil)
		if err != nil {
			return err
		}
		defer coll.Close()
		socks, peers = coll.Maps["socks"], coll.Maps["peers"]
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: socks.FD(), Program: coll.Programs["verdict"], Attach: ebpf.AttachSkSKBStreamVerdict,
		}); err != nil {
			return fmt.Errorf("attaching the stream verdict: %w", err)
		}
	}
	l, err := net.Listen("tcp4", *listen)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go relay(*mode, c.(*net.TCPConn), *upstream, socks, peers)
		}
	}()
	fmt.Println("ready", l.Addr())
	<-stop
	return l.Close()
}

func loadObject(path string, consts map[string]any) (*ebpf.Collection, error) {
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	for name, v := range consts {
		vs, ok := spec.Variables[name]
		if !ok {
			return nil, fmt.Errorf("%s has no variable %s", path, name)
		}
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", path, err)
	}
	return coll, nil
}

// plain hides ReadFrom and WriteTo, so that io.Copy reads and writes (no splice).
type plain struct{ io.ReadWriter }

func relay(mode string, c *net.TCPConn, upstream string, socks, peers *ebpf.Map) {
	defer c.Close()
	u, err := net.Dial("tcp4", upstream)
	if err != nil {
		return
	}
	uc := u.(*net.TCPConn)
	defer uc.Close()
	switch mode {
	case "splice":
		go func() { io.Copy(uc, c); uc.CloseWrite() }()
		io.Copy(c, uc)
	case "user":
		go func() { io.CopyBuffer(plain{uc}, plain{c}, make([]byte, 16<<10)); uc.CloseWrite() }()
		io.CopyBuffer(plain{c}, plain{uc}, make([]byte, 16<<10))
	case "sockmap":
		ck1, ck2 := cookie(c), cookie(uc)
		if ck1 == 0 || ck2 == 0 || peers.Put(ck1, ck2) != nil || peers.Put(ck2, ck1) != nil {
			return
		}
		defer peers.Delete(ck1)
		defer peers.Delete(ck2)
		if socks.Put(ck1, uint64(fd(c))) != nil || socks.Put(ck2, uint64(fd(uc))) != nil {
			return
		}
		// The bytes never reach these sockets' queues; a read returns at the end.
		c.Read(make([]byte, 1))
	}
}

func fd(c *net.TCPConn) int {
	var n int
	rc, _ := c.SyscallConn()
	rc.Control(func(f uintptr) { n = int(f) })
	return n
}

func cookie(c *net.TCPConn) uint64 {
	var v uint64
	rc, _ := c.SyscallConn()
	rc.Control(func(f uintptr) { v, _ = unix.GetsockoptUint64(int(f), unix.SOL_SOCKET, unix.SO_COOKIE) })
	return v
}

// clientVerdict attaches the sockops and sk_msg programs of msg.bpf.o until stop, then
// reports on stdout how many sends the verdict saw (a run where it saw none measured
// nothing).
func clientVerdict(obj, program, cgroup string, server netip.AddrPort, stop <-chan os.Signal) error {
	consts, err := verdictConsts(server.Port())
	if err != nil {
		return err
	}
	coll, err := loadObject(obj, consts)
	if err != nil {
		return err
	}
	defer coll.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: coll.Maps["clients"].FD(), Program: coll.Programs[program], Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return fmt.Errorf("attaching the sk_msg verdict: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: coll.Programs["track"]})
	if err != nil {
		return fmt.Errorf("attaching sockops to %s: %w", cgroup, err)
	}
	defer l.Close()
	fmt.Println("ready", server)
	<-stop
	var allowed, other []uint64
	if err := coll.Maps["counts"].Lookup(uint32(0), &allowed); err != nil {
		return err
	}
	if err := coll.Maps["counts"].Lookup(uint32(1), &other); err != nil {
		return err
	}
	fmt.Printf("sends seen: %d allowed, %d other\n", sum(allowed), sum(other))
	return nil
}

func sum(v []uint64) (n uint64) {
	for _, x := range v {
		n += x
	}
	return n
}

// cgroup2Mount finds where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified beside v1 controllers).
func cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount in /proc/self/mounts")
}

// serverMain serves the L7 benchmark's HTTP handler (GET /v1) on --listen until SIGTERM,
// after printing "ready ADDRESS".
func serverMain(args []string) error {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	l, err := net.Listen("tcp4", *listen)
	if err != nil {
		return err
	}
	fmt.Println("ready", l.Addr())
	return l7.ServeHTTP(ctx, l)
}

// verdictConsts are the load-time constants of the sockops programs: the server port and
// the cookie of this process's network namespace, where the server listens.
func verdictConsts(port uint16) (map[string]any, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return nil, fmt.Errorf("reading the network namespace cookie: %w", err)
	}
	return map[string]any{"server_port": uint32(port), "netns_cookie": cookie}, nil
}
