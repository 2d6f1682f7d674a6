package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"regexp"
	"strconv"
	"time"
)

// A minimal FTP client (RFC 959 with RFC 2428 EPSV): log in, store a file, retrieve a file.
// Passive mode only, as a client behind a policy needs it: every data connection is opened
// by the client towards a port the server chose from its passive range, which is why the
// egress policy of examples/starwars allows that range as well as port 21.

type ftpClient struct {
	conn net.Conn
	tp   *textproto.Conn
	host string // the server's address, for data connections
}

// ftpTarget is a parsed ftp:// URL: ftp://[user[:password]@]host[:port]/path.
type ftpTarget struct {
	Addr     string // host:port
	User     string // "anonymous" when the URL names no user
	Password string
	Path     string
}

func parseFTPURL(s string) (ftpTarget, error) {
	u, err := url.Parse(s)
	if err != nil {
		return ftpTarget{}, fmt.Errorf("parsing %q: %w", s, err)
	}
	if u.Scheme != "ftp" || u.Host == "" || u.Path == "" || u.Path == "/" {
		return ftpTarget{}, fmt.Errorf("%q: want ftp://[user[:password]@]host[:port]/path", s)
	}
	t := ftpTarget{Addr: u.Host, User: "anonymous", Password: "anonymous@", Path: u.Path}
	if u.Port() == "" {
		t.Addr = net.JoinHostPort(u.Hostname(), "21")
	}
	if u.User != nil {
		t.User = u.User.Username()
		t.Password, _ = u.User.Password()
	}
	return t, nil
}

// String hides the password.
func (t ftpTarget) String() string {
	if t.User == "anonymous" {
		return "ftp://" + t.Addr + t.Path
	}
	return "ftp://" + t.User + "@" + t.Addr + t.Path
}

// dialFTP connects and logs in. The whole session is bounded by ctx's deadline.
func dialFTP(ctx context.Context, t ftpTarget) (*ftpClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", t.Addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
	c := &ftpClient{conn: conn, tp: textproto.NewConn(conn), host: host}
	if _, _, err := c.tp.ReadResponse(220); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting from %s: %w", t.Addr, err)
	}
	code, msg, err := c.cmd(0, "USER %s", t.User)
	if err != nil {
		c.Close()
		return nil, err
	}
	if code == 331 {
		code, msg, err = c.cmd(0, "PASS %s", t.Password)
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	if code != 230 {
		c.Close()
		return nil, fmt.Errorf("login as %s refused: %d %s", t.User, code, msg)
	}
	if _, _, err := c.cmd(200, "TYPE I"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// cmd sends a command and reads its reply; with expect != 0 any other code is an error.
func (c *ftpClient) cmd(expect int, format string, args ...any) (int, string, error) {
	id, err := c.tp.Cmd(format, args...)
	if err != nil {
		return 0, "", fmt.Errorf("sending %s: %w", verb(format), err)
	}
	c.tp.StartResponse(id)
	defer c.tp.EndResponse(id)
	code, msg, err := c.tp.ReadResponse(expect)
	if err != nil {
		return code, msg, fmt.Errorf("%s: %w", verb(format), err)
	}
	return code, msg, nil
}

func verb(format string) string {
	for i, r := range format {
		if r == ' ' {
			return format[:i]
		}
	}
	return format
}

var (
	epsvRE = regexp.MustCompile(`\(\|\|\|(\d+)\|\)`)
	pasvRE = regexp.MustCompile(`(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)`)
)

// dataConn opens a passive data connection: EPSV first (the port only; the address is the
// control connection's), PASV if the server does not know EPSV.
func (c *ftpClient) dataConn(ctx context.Context) (net.Conn, error) {
	var port int
	code, msg, err := c.cmd(0, "EPSV")
	if err != nil {
		return nil, err
	}
	if m := epsvRE.FindStringSubmatch(msg); code == 229 && m != nil {
		port, _ = strconv.Atoi(m[1])
	} else {
		_, msg, err := c.cmd(227, "PASV")
		if err != nil {
			return nil, err
		}
		m := pasvRE.FindStringSubmatch(msg)
		if m == nil {
			return nil, fmt.Errorf("PASV: cannot read the address in %q", msg)
		}
		hi, _ := strconv.Atoi(m[5])
		lo, _ := strconv.Atoi(m[6])
		port = hi<<8 | lo
	}
	var d net.Dialer
	addr := net.JoinHostPort(c.host, strconv.Itoa(port))
	dc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("opening data connection to %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		dc.SetDeadline(dl)
	}
	return dc, nil
}

// Store uploads data as path, replacing the file.
func (c *ftpClient) Store(ctx context.Context, path string, data []byte) error {
	dc, err := c.dataConn(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	code, msg, err := c.cmd(0, "STOR %s", path)
	if err != nil {
		return err
	}
	if code != 125 && code != 150 { // anything but "go ahead" is a refusal
		return fmt.Errorf("STOR %s: %d %s", path, code, msg)
	}
	if _, err := dc.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := dc.Close(); err != nil {
		return fmt.Errorf("closing data connection: %w", err)
	}
	if _, _, err := c.tp.ReadResponse(226); err != nil {
		return fmt.Errorf("STOR %s: %w", path, err)
	}
	return nil
}

// Retrieve downloads path.
func (c *ftpClient) Retrieve(ctx context.Context, path string) ([]byte, error) {
	dc, err := c.dataConn(ctx)
	if err != nil {
		return nil, err
	}
	defer dc.Close()
	code, msg, err := c.cmd(0, "RETR %s", path)
	if err != nil {
		return nil, err
	}
	if code != 125 && code != 150 {
		return nil, fmt.Errorf("RETR %s: %d %s", path, code, msg)
	}
	data, err := io.ReadAll(dc)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if _, _, err := c.tp.ReadResponse(226); err != nil {
		return nil, fmt.Errorf("RETR %s: %w", path, err)
	}
	return data, nil
}

// Close ends the session politely when it can.
func (c *ftpClient) Close() error {
	c.conn.SetDeadline(time.Now().Add(time.Second))
	c.tp.Cmd("QUIT")
	return c.tp.Close()
}

// ftpUpload logs in to t and stores data at t.Path.
func ftpUpload(ctx context.Context, t ftpTarget, data []byte) error {
	c, err := dialFTP(ctx, t)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Store(ctx, t.Path, data)
}

// ftpDownload logs in to t and reads t.Path.
func ftpDownload(ctx context.Context, t ftpTarget) ([]byte, error) {
	c, err := dialFTP(ctx, t)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Retrieve(ctx, t.Path)
}

// isTimeout tells a dropped connection (no answer) from a refused one.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
