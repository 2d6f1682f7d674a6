// Command rampart-cni is Rampart's CNI plugin (CNI spec 1.0 and 1.1): a container runtime
// runs it for ADD, CHECK, DEL, GC, STATUS and VERSION, and it hands each to the node's
// agent (rampartd) over the agent's API socket. The agent does the work and keeps the
// state; the plugin translates the runtime's environment and configuration into API
// requests and the agent's answers into CNI results and errors.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/netns"
	rversion "github.com/rampartnet/rampart/internal/version"
)

// supportedVersions are the CNI spec versions the plugin speaks: 1.1.0 adds GC and
// STATUS.
var supportedVersions = []string{"1.0.0", "1.1.0"}

// requestTimeout bounds one request to the agent. An ADD waits for the agent's lock
// behind other changes; a minute is far beyond a healthy agent's time.
const requestTimeout = time.Minute

// Error codes of the plugin's own (the spec leaves 100 and above to plugins).
const (
	// errAgentRefused: the agent refused the request for a reason of its own (an
	// attachment that exists already, a full pod range); the message says which.
	errAgentRefused uint = 100
)

// netConf is the plugin's entry of the network configuration list.
type netConf struct {
	types.PluginConf
	// Socket is the agent's API socket; Instance names an agent instance whose default
	// socket (/run/rampart/<instance>.sock) is used. At most one of them; neither means
	// the default instance.
	Socket   string `json:"socket,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// parseConf decodes the plugin's configuration (stdin) and returns it with the agent's
// socket.
func parseConf(data []byte) (*netConf, string, *types.Error) {
	var c netConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, "", types.NewError(types.ErrDecodingFailure, "decoding network configuration", err.Error())
	}
	if !slices.Contains(supportedVersions, c.CNIVersion) {
		return nil, "", types.NewError(types.ErrIncompatibleCNIVersion, "network configuration: incompatible CNI version",
			fmt.Sprintf("cniVersion %q: rampart-cni supports %s", c.CNIVersion, strings.Join(supportedVersions, ", ")))
	}
	switch {
	case c.Socket != "" && c.Instance != "":
		return nil, "", types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
			"socket and instance: give one of them, not both")
	case c.Socket != "":
		if !filepath.IsAbs(c.Socket) {
			return nil, "", types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
				fmt.Sprintf("socket %q: want an absolute path", c.Socket))
		}
		return &c, c.Socket, nil
	case c.Instance != "":
		if err := api.CheckInstance(c.Instance); err != nil {
			return nil, "", types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
				fmt.Sprintf("instance: %v", err))
		}
		return &c, api.SocketFor(c.Instance), nil
	}
	return &c, api.SocketFor(api.DefaultInstance), nil
}

// podArgs reads K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS ("K=V;K=V"); other keys
// are the runtime's business and ignored.
func podArgs(args string) (namespace, name string, _ *types.Error) {
	if args == "" {
		return "", "", nil
	}
	for _, kv := range strings.Split(args, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", "", types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI_ARGS",
				fmt.Sprintf("%q: want KEY=VALUE pairs separated by ';'", kv))
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return namespace, name, nil
}

// checkNetns refuses a CNI_NETNS that is the plugin's own network namespace (the
// runtime's: the node's) or the host's, before the agent is asked: the pod's interface,
// address and default route would go there. skel's own check of this runs only after ADD
// has done its work. The agent checks again, and also refuses a namespace in use (another
// pod's, another node's). A path that cannot be read is the agent's to judge.
func checkNetns(path string) *types.Error {
	what, err := netns.Reserved(path)
	if err != nil || what == "" {
		return nil
	}
	return types.NewError(types.ErrInvalidNetNS, "invalid CNI_NETNS",
		fmt.Sprintf("network namespace %s is %s (the plugin runs in the runtime's), not a pod's", path, what))
}

// agentError turns an error of a request to the agent into a CNI error.
func agentError(socket, what string, err error) *types.Error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		// No answer: the agent is not running (yet), or restarting.
		return types.NewError(types.ErrTryAgainLater, "the Rampart agent is not reachable",
			fmt.Sprintf("%s: agent socket %s: %v", what, socket, err))
	}
	switch ae.Status {
	case http.StatusBadRequest:
		return types.NewError(types.ErrInvalidEnvironmentVariables, what+": the agent refused the request", ae.Message)
	case http.StatusNotFound:
		return types.NewError(types.ErrUnknownContainer, what+": unknown container", ae.Message)
	case http.StatusConflict:
		return types.NewError(errAgentRefused, what+": the agent refused the request", ae.Message)
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return types.NewError(types.ErrTryAgainLater, what+": the agent is busy", ae.Message)
	}
	return types.NewError(types.ErrInternal, what+": the agent failed", ae.Message)
}

// plugin runs the commands against the agent.
type plugin struct{}

// call runs do against the agent the configuration in stdin names, with a request's time
// limit, and returns do's error; a configuration it cannot read is the error instead.
func (plugin) call(stdin []byte, do func(ctx context.Context, conf *netConf, cl *api.Client, socket string) error) error {
	conf, socket, terr := parseConf(stdin)
	if terr != nil {
		return terr
	}
	cl := api.NewClient(socket)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	return do(ctx, conf, cl, socket)
}

func (p plugin) add(args *skel.CmdArgs) error {
	return p.call(args.StdinData, func(ctx context.Context, conf *netConf, cl *api.Client, socket string) error {
		ns, name, terr := podArgs(args.Args)
		if terr != nil {
			return terr
		}
		if terr := checkNetns(args.Netns); terr != nil {
			return terr
		}
		r, err := cl.CNIAdd(ctx, api.CNIAddRequest{ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName, PodNamespace: ns, PodName: name})
		if err != nil {
			return agentError(socket, "ADD", err)
		}
		res, err := cniResult(conf.CNIVersion, r)
		if err != nil {
			return types.NewError(types.ErrInternal, "ADD: the agent's answer", err.Error())
		}
		return types.PrintResult(res, conf.CNIVersion)
	})
}

// cniResult renders the agent's answer as a result of the spec's 1.x format: the host
// side and the container side of the veth, the address on the container side, and the
// default route through the node's router; on a dual-stack node also the IPv6 address
// and default route, through the IPv6 router (the host veth's link-local address).
func cniResult(cniVersion string, r api.CNIResult) (*types100.Result, error) {
	res := &types100.Result{
		CNIVersion: cniVersion,
		Interfaces: []*types100.Interface{
			{Name: r.HostInterface, Mac: r.HostMAC},
			{Name: r.IfName, Mac: r.MAC, Sandbox: r.Netns},
		},
	}
	ipc, err := ipConfig(r.IP, r.Gateway)
	if err != nil {
		return nil, err
	}
	res.IPs = append(res.IPs, ipc)
	if r.IP6 != "" {
		ipc, err := ipConfig(r.IP6, r.Gateway6)
		if err != nil {
			return nil, err
		}
		res.IPs = append(res.IPs, ipc)
	}
	for _, d := range r.Routes {
		_, dst, err := net.ParseCIDR(d)
		if err != nil {
			return nil, fmt.Errorf("route %q: %w", d, err)
		}
		// Through the gateway of the route's family.
		i := slices.IndexFunc(res.IPs, func(c *types100.IPConfig) bool { return (c.Address.IP.To4() == nil) == (dst.IP.To4() == nil) })
		if i < 0 {
			return nil, fmt.Errorf("route %q: no address of its family", d)
		}
		res.Routes = append(res.Routes, &types.Route{Dst: *dst, GW: res.IPs[i].Gateway})
	}
	return res, nil
}

// ipConfig is an address of the container side (CIDR notation) with its gateway.
func ipConfig(addr, gateway string) (*types100.IPConfig, error) {
	ip, err := types.ParseCIDR(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	gw := net.ParseIP(gateway)
	if gw == nil {
		return nil, fmt.Errorf("gateway %q: not an IP address", gateway)
	}
	if (ip.IP.To4() == nil) != (gw.To4() == nil) {
		return nil, fmt.Errorf("gateway %s of address %s: another address family", gateway, addr)
	}
	return &types100.IPConfig{Address: *ip, Gateway: gw, Interface: types100.Int(1)}, nil
}

func (p plugin) del(args *skel.CmdArgs) error {
	return p.call(args.StdinData, func(ctx context.Context, _ *netConf, cl *api.Client, socket string) error {
		if err := cl.CNIDel(ctx, api.CNIAttachment{ContainerID: args.ContainerID, IfName: args.IfName}); err != nil {
			return agentError(socket, "DEL", err)
		}
		return nil
	})
}

func (p plugin) check(args *skel.CmdArgs) error {
	return p.call(args.StdinData, func(ctx context.Context, conf *netConf, cl *api.Client, socket string) error {
		r, err := cl.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: args.ContainerID, IfName: args.IfName}, Netns: args.Netns})
		if err != nil {
			return agentError(socket, "CHECK", err)
		}
		// The runtime's record of the ADD (prevResult) must name the addresses the agent has.
		if conf.RawPrevResult != nil {
			if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
				return types.NewError(types.ErrDecodingFailure, "CHECK: decoding prevResult", err.Error())
			}
			prev, err := types100.NewResultFromResult(conf.PrevResult)
			if err != nil {
				return types.NewError(types.ErrDecodingFailure, "CHECK: converting prevResult", err.Error())
			}
			for _, addr := range []string{r.IP, r.IP6} {
				if addr == "" {
					continue
				}
				if !slices.ContainsFunc(prev.IPs, func(ipc *types100.IPConfig) bool { return ipc.Address.String() == addr }) {
					return types.NewError(errAgentRefused, "CHECK: prevResult does not match the endpoint",
						fmt.Sprintf("endpoint %s/%s has address %s, not in prevResult", r.Namespace, r.Name, addr))
				}
			}
		}
		return nil
	})
}

func (p plugin) gc(args *skel.CmdArgs) error {
	return p.call(args.StdinData, func(ctx context.Context, conf *netConf, cl *api.Client, socket string) error {
		req := api.CNIGCRequest{Valid: []api.CNIAttachment{}}
		for _, a := range conf.ValidAttachments {
			req.Valid = append(req.Valid, api.CNIAttachment{ContainerID: a.ContainerID, IfName: a.IfName})
		}
		if _, err := cl.CNIGC(ctx, req); err != nil {
			return agentError(socket, "GC", err)
		}
		return nil
	})
}

func (p plugin) status(args *skel.CmdArgs) error {
	return p.call(args.StdinData, func(ctx context.Context, _ *netConf, cl *api.Client, socket string) error {
		if _, err := cl.Status(ctx); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "the Rampart agent is not available",
				fmt.Sprintf("agent socket %s: %v", socket, err))
		}
		return nil
	})
}

// about is what the plugin prints on stderr when run by hand.
var about = "rampart-cni " + rversion.Get().String() + ": Rampart's CNI plugin, served by the node's rampartd"

// checkCommand refuses a missing CNI_COMMAND, which skel answers with exit 0 and no
// output: a runtime (or a script) that forgot it would read that as success.
func checkCommand(cmd string) *types.Error {
	if cmd != "" {
		return nil
	}
	return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_COMMAND is not set",
		"want one of ADD, DEL, CHECK, GC, STATUS, VERSION")
}

func main() {
	if terr := checkCommand(os.Getenv("CNI_COMMAND")); terr != nil {
		fmt.Fprintln(os.Stderr, about)
		if err := terr.Print(); err != nil {
			fmt.Fprintf(os.Stderr, "writing the error: %v\n", err)
		}
		os.Exit(1)
	}
	p := plugin{}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    p.add,
		Del:    p.del,
		Check:  p.check,
		GC:     p.gc,
		Status: p.status,
	}, version.PluginSupports(supportedVersions...), about)
}
