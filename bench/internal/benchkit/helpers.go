package benchkit

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"time"
)

// Helpers are the subcommands a benchmark runs inside its endpoints: the request/response
// server and client and a TCP connection probe. They live in each benchmark's own binary
// (which dispatches them to Helper) so that nothing else needs installing.
var Helpers = []string{"rr-server", "rr-client", "probe"}

// Helper runs helper subcommand name with args, writing results to stdout, and returns the
// process exit code.
func Helper(name string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := InterruptContext()
	defer stop()
	fs := SubcommandFlags(name, stderr)
	req := fs.Int("request", 1, "request size in bytes")
	resp := fs.Int("response", 1, "response size in bytes")
	var err error
	switch name {
	case "rr-server":
		listen := fs.String("listen", ":5202", "listen address")
		if fs.Parse(args) != nil {
			return 2
		}
		var ln net.Listener
		if ln, err = net.Listen("tcp", *listen); err == nil {
			err = ServeRR(ctx, ln, *req, *resp)
		}
	case "rr-client":
		addr := fs.String("addr", "", "server address host:port")
		dur := fs.Duration("duration", 2*time.Second, "how long to run transactions")
		ct := fs.Duration("connect-timeout", 10*time.Second, "how long to retry connecting")
		if fs.Parse(args) != nil {
			return 2
		}
		var r RRResult
		if r, err = RunRRClient(ctx, *addr, *req, *resp, *dur, *ct); err == nil {
			err = json.NewEncoder(stdout).Encode(r)
		}
	case "probe":
		addr := fs.String("addr", "", "address host:port")
		timeout := fs.Duration("timeout", 500*time.Millisecond, "connection attempt timeout")
		if fs.Parse(args) != nil {
			return 2
		}
		var out string
		if out, err = Probe(ctx, *addr, *timeout); err == nil {
			fmt.Fprintln(stdout, out)
		}
	default:
		return UnknownSubcommand(stderr, name)
	}
	return SubcommandExit(stderr, name, err)
}

// SubcommandFlags are a helper subcommand's flags: parse errors go to stderr.
func SubcommandFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// UnknownSubcommand says on stderr that name is no subcommand and returns 2, the exit code.
func UnknownSubcommand(stderr io.Writer, name string) int {
	fmt.Fprintf(stderr, "unknown subcommand %q\n", name)
	return 2
}

// SubcommandExit is the exit code of subcommand name that returned err: 0, or 1 with the
// error on stderr.
func SubcommandExit(stderr io.Writer, name string, err error) int {
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
