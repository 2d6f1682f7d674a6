package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// TestSenderSocket checks what a send-side L7 verdict would rely on to stop a client from
// going around it (docs/benchmarks.md, the skrelay section): a tc program on an endpoint's
// host-side veth sees, for each packet that crossed from the endpoint's namespace, the
// socket that sent it. A TCP connection's packets carry its socket's cookie; a TCP segment
// forged on a raw socket in the same namespace carries the raw socket's, not the
// connection's.
func TestSenderSocket(t *testing.T) {
	const port = 8080
	node := agenttest.NewBareNode(t)
	client := node.Add("client", netip.MustParseAddr("198.18.0.10"))
	server := node.Add("server", netip.MustParseAddr("198.18.0.11"))
	obj := compileBPF(t, "skcheck", t.TempDir())

	coll, err := loadObject(obj, map[string]any{"port": uint32(port)})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	err = testenv.InNetns(node.Path, func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: client.HostIfIndex, Program: coll.Programs["sender_socket"], Attach: ebpf.AttachTCXIngress})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		t.Fatalf("attaching to %s: %v", client.HostIfName, err)
	}
	srv, err := testenv.Serve(server.NetnsPath, []uint16{port}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	// A connection that sends a line and reads its echo, then closes.
	var conn net.Conn
	err = testenv.InNetns(client.NetnsPath, func() (err error) {
		conn, err = net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", server.IP, port), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	connCookie := cookie(conn.(*net.TCPConn))
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(conn, "GET /v1 HTTP/1.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
		t.Fatalf("echo: %v", err)
	}
	conn.Close()

	// A segment of that connection's shape, forged on a raw socket.
	var rawCookie uint64
	err = testenv.InNetns(client.NetnsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if rawCookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			return err
		}
		payload := "PUT /v1/exhaust-port HTTP/1.1\r\n\r\n"
		seg := make([]byte, 20, 20+len(payload))
		binary.BigEndian.PutUint16(seg[0:], 40000)
		binary.BigEndian.PutUint16(seg[2:], port)
		binary.BigEndian.PutUint32(seg[4:], 1)
		seg[12] = 5 << 4 // data offset: 20 bytes
		seg[13] = 0x18   // PSH, ACK
		binary.BigEndian.PutUint16(seg[14:], 65535)
		seg = append(seg, payload...)
		return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: server.IP.As4()})
	})
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}

	senders := map[uint64]uint64{}
	ok := testenv.Eventually(5*time.Second, func() bool {
		clear(senders)
		var k, v uint64
		it := coll.Maps["senders"].Iterate()
		for it.Next(&k, &v) {
			senders[k] = v
		}
		return senders[rawCookie] > 0
	})
	t.Logf("connection's socket %d, raw socket %d; packets seen per sender cookie: %v", connCookie, rawCookie, senders)
	if !ok {
		t.Fatalf("the forged segment was not seen with the raw socket's cookie")
	}
	if connCookie == 0 || connCookie == rawCookie {
		t.Fatalf("cookies: connection %d, raw %d", connCookie, rawCookie)
	}
	// SYN, the ACK that completes the handshake, the line and the FIN at least.
	if senders[connCookie] < 4 {
		t.Errorf("%d packets with the connection's socket, want at least 4", senders[connCookie])
	}
	if senders[rawCookie] != 1 {
		t.Errorf("%d packets with the raw socket, want 1", senders[rawCookie])
	}
	if senders[0] != 0 {
		t.Errorf("%d packets with no socket", senders[0])
	}
}
