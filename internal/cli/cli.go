package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/version"
)

// ExitError carries an exit code that is not a plain failure (endpoint exec passes the
// command's own code through).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// IO is where a command reads and writes.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

type app struct {
	io       IO
	instance string
	socket   string
	client   *api.Client
	// where is the socket the client talks to (for messages).
	where string
}

// socketPath is the agent's socket: --socket, else the socket of --instance, else
// $RAMPART_SOCKET, else the socket of $RAMPART_INSTANCE, else the default instance's.
// A flag wins over the environment; a socket wins over an instance at the same level.
func (a *app) socketPath(cmd *cobra.Command) (string, error) {
	flags := cmd.Flags()
	if flags.Changed("socket") {
		return a.socket, nil
	}
	inst := a.instance
	if !flags.Changed("instance") {
		if s := os.Getenv("RAMPART_SOCKET"); s != "" {
			return s, nil
		}
		inst = os.Getenv("RAMPART_INSTANCE")
		if inst == "" {
			inst = api.DefaultInstance
		}
	}
	if err := api.CheckInstance(inst); err != nil {
		return "", err
	}
	return api.SocketFor(inst), nil
}

// Run executes the rampart command line with args (without the program name) and returns
// the process exit code. Errors are printed to stderr as "Error: ...".
func Run(ctx context.Context, args []string, stdio IO) int {
	cmd := NewCommand(stdio)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	fmt.Fprintf(stdio.Err, "Error: %v\n", err)
	return 1
}

// NewCommand builds the command tree.
func NewCommand(stdio IO) *cobra.Command {
	a := &app{io: stdio}
	root := &cobra.Command{
		Use:           "rampart",
		Short:         "Control the rampart agent: endpoints, namespaces, policies, CIDR sets, flows",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			socket, err := a.socketPath(cmd)
			if err != nil {
				return err
			}
			a.client, a.where = api.NewClient(socket), socket
			return nil
		},
	}
	root.SetIn(stdio.In)
	root.SetOut(stdio.Out)
	root.SetErr(stdio.Err)
	root.PersistentFlags().StringVar(&a.instance, "instance", "", "agent instance to talk to, at its default socket /run/rampart/<instance>.sock (env RAMPART_INSTANCE; default \""+api.DefaultInstance+"\")")
	root.PersistentFlags().StringVar(&a.socket, "socket", "", "agent API socket; overrides --instance (env RAMPART_SOCKET)")
	root.AddCommand(
		a.endpointCommand(),
		a.namespaceCommand(),
		a.nodeCommand(),
		a.remoteCommand(),
		a.serviceCommand(),
		a.identityCommand(),
		a.applyCommand(),
		a.deleteCommand(),
		a.getCommand(),
		a.uiCommand(),
		a.policyCommand(),
		a.cidrsetCommand(),
		a.tapCommand(),
		a.monitorCommand(),
		a.observeCommand(),
		a.statusCommand(),
		a.versionCommand(),
	)
	return root
}

func (a *app) printf(format string, args ...any) { fmt.Fprintf(a.io.Out, format, args...) }

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.io.Out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// splitKey parses NAMESPACE/NAME.
func splitKey(s string) (string, string, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	return ns, name, nil
}

// parseLabelArgs reads k=v (set) and k- (remove) arguments.
func parseLabelArgs(args []string) (api.LabelChange, error) {
	c := api.LabelChange{Set: map[string]string{}}
	for _, arg := range args {
		for _, part := range strings.Split(arg, ",") {
			if part == "" {
				continue
			}
			if k, v, ok := strings.Cut(part, "="); ok {
				if k == "" {
					return c, fmt.Errorf("label %q: empty key", part)
				}
				c.Set[k] = v
				continue
			}
			if strings.HasSuffix(part, "-") && len(part) > 1 {
				c.Remove = append(c.Remove, strings.TrimSuffix(part, "-"))
				continue
			}
			return c, fmt.Errorf("label %q: want key=value or key-", part)
		}
	}
	if len(c.Set) == 0 && len(c.Remove) == 0 {
		return c, errors.New("no label changes given (key=value or key-)")
	}
	return c, nil
}

// parseLabelSet reads "k=v,k2=v2".
func parseLabelSet(s []string) (map[string]string, error) {
	out := map[string]string{}
	for _, arg := range s {
		for _, part := range strings.Split(arg, ",") {
			if strings.TrimSpace(part) == "" {
				continue
			}
			k, v, ok := strings.Cut(part, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("label %q: want key=value", part)
			}
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out, nil
}

// parsePortProto reads PORT[/PROTO] (protocol default TCP).
func parsePortProto(s string) (uint16, string, error) {
	p, proto, ok := strings.Cut(s, "/")
	if !ok {
		proto = "TCP"
	}
	var n uint64
	if _, err := fmt.Sscanf(p, "%d", &n); err != nil || fmt.Sprint(n) != p || n > 65535 {
		return 0, "", fmt.Errorf("port %q: want a number 0-65535", p)
	}
	return uint16(n), strings.ToUpper(proto), nil
}

func contextOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// versionJSON is `rampart version -o json`: the CLI's build and what the agent said.
type versionJSON struct {
	Client version.Info `json:"client"`
	Agent  agentVersion `json:"agent"`
}

type agentVersion struct {
	Socket   string `json:"socket"`
	Answered bool   `json:"answered"`
	Instance string `json:"instance,omitempty"`
	Version  string `json:"version,omitempty"` // "" from an agent older than the field
	Error    string `json:"error,omitempty"`   // why none answered
}

// versionCommand prints the CLI's build and, when an agent answers, the agent's.
func (a *app) versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the CLI's version and, if it answers, the agent's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			ctx, cancel := context.WithTimeout(contextOf(cmd), 2*time.Second)
			defer cancel()
			st, err := a.client.Status(ctx)
			v := versionJSON{Client: version.Get(), Agent: agentVersion{Socket: a.where}}
			if err != nil {
				v.Agent.Error = err.Error()
			} else {
				v.Agent.Answered, v.Agent.Instance, v.Agent.Version = true, st.Instance, st.Version
			}
			if output == "json" {
				return a.printJSON(v)
			}
			a.printf("rampart %s\n", v.Client)
			switch {
			case err != nil:
				a.printf("agent: none answers at %s (%v)\n", a.where, err)
			case st.Version == "":
				a.printf("agent: instance %s at %s, version unknown (an agent older than the version field)\n", st.Instance, a.where)
			default:
				a.printf("agent: rampartd %s (instance %s at %s)\n", st.Version, st.Instance, a.where)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
