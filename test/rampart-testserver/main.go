// Command rampart-testserver serves TCP and UDP echo on given ports, or probes one, for
// demos and tests run with `rampart endpoint exec`:
//
//	rampart endpoint exec x/a -- rampart-testserver serve --tcp 80,81 --udp 80,81
//	rampart endpoint exec y/b -- rampart-testserver probe --tcp 198.18.0.2:80 --timeout 1s
//
// probe exits 0 when the peer answered and 1 when it did not.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "probe":
		probe(os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rampart-testserver serve [--tcp P,..] [--udp P,..] | probe (--tcp|--udp) ADDR:PORT [--timeout D]")
	os.Exit(2)
}

func ports(s string) []uint16 {
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			fmt.Fprintf(os.Stderr, "rampart-testserver: bad port %q\n", f)
			os.Exit(2)
		}
		out = append(out, uint16(n))
	}
	return out
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	tcp := fs.String("tcp", "", "TCP ports")
	udp := fs.String("udp", "", "UDP ports")
	fs.Parse(args)
	var ls []net.Listener
	for _, p := range ports(*tcp) {
		l, err := net.Listen("tcp4", fmt.Sprintf(":%d", p))
		if err != nil {
			fmt.Fprintf(os.Stderr, "rampart-testserver: %v\n", err)
			os.Exit(1)
		}
		ls = append(ls, l)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go testenv.EchoTCP(c)
			}
		}()
	}
	for _, p := range ports(*udp) {
		c, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", p))
		if err != nil {
			fmt.Fprintf(os.Stderr, "rampart-testserver: %v\n", err)
			os.Exit(1)
		}
		go testenv.EchoUDP(c)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	for _, l := range ls {
		l.Close()
	}
}

func probe(args []string) {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	tcp := fs.String("tcp", "", "ADDR:PORT to connect to")
	udp := fs.String("udp", "", "ADDR:PORT to send a datagram to")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for the answer")
	fs.Parse(args)
	proto, target := "tcp", *tcp
	if *udp != "" {
		proto, target = "udp", *udp
	}
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		usage()
	}
	if testenv.Probe("/proc/self/ns/net", ap, proto, *timeout) {
		fmt.Printf("%s %s: connected\n", proto, ap)
		return
	}
	fmt.Printf("%s %s: no answer\n", proto, ap)
	os.Exit(1)
}
