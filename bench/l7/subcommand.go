package l7

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Subcommands are the helpers the benchmark runs inside endpoints. They live in the
// benchmark's own binary so that nothing else needs installing.
var Subcommands = []string{"http-server", "http-probe"}

// Subcommand runs helper subcommand name with args, writing results to stdout, and returns
// the process exit code.
//
//	http-server --listen :8080
//	http-probe --timeout 500ms NAME=METHOD,URL ...   (prints {"NAME": "outcome", ...})
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	fs := benchkit.SubcommandFlags(name, stderr)
	var err error
	switch name {
	case "http-server":
		listen := fs.String("listen", fmt.Sprintf(":%d", httpPort), "listen address")
		if fs.Parse(args) != nil {
			return 2
		}
		var ln net.Listener
		if ln, err = net.Listen("tcp", *listen); err == nil {
			err = ServeHTTP(ctx, ln)
		}
	case "http-probe":
		timeout := fs.Duration("timeout", 500*time.Millisecond, "connection attempt timeout")
		if fs.Parse(args) != nil {
			return 2
		}
		var reqs []ProbeRequest
		for _, a := range fs.Args() {
			n, spec, ok1 := strings.Cut(a, "=")
			m, u, ok2 := strings.Cut(spec, ",")
			if !ok1 || !ok2 {
				fmt.Fprintf(stderr, "http-probe: want NAME=METHOD,URL, got %q\n", a)
				return 2
			}
			reqs = append(reqs, ProbeRequest{Name: n, Method: m, URL: u})
		}
		var out map[string]string
		if out, err = ProbeAll(ctx, reqs, *timeout); err == nil {
			err = json.NewEncoder(stdout).Encode(out)
		}
	default:
		return benchkit.UnknownSubcommand(stderr, name)
	}
	return benchkit.SubcommandExit(stderr, name, err)
}
