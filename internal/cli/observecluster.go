package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/relay"
	"github.com/rampartnet/rampart/internal/servicemap"
)

// clusterFlags choose the cluster's view: every node's agent, through the API server.
type clusterFlags struct {
	on                  bool
	kubeconfig          string
	namespace, selector string
}

func (c *clusterFlags) register(f *pflag.FlagSet, what string) {
	f.BoolVar(&c.on, "cluster", false, what+" of every node's agent (each reached through the API server's exec into its pod: needs pods/exec on the agent pods)")
	f.StringVar(&c.kubeconfig, "kubeconfig", "", "with --cluster: the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	f.StringVar(&c.namespace, "agent-namespace", relay.DefaultNamespace, "with --cluster: the agent pods' namespace")
	f.StringVar(&c.selector, "agent-selector", relay.DefaultSelector, "with --cluster: the agent pods' label selector")
}

// relay is the cluster's view; what it leaves out is said on stderr.
func (a *app) relay(c clusterFlags) (*relay.Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--cluster: loading the kubeconfig: %w", err)
	}
	r, err := relay.New(cfg, c.namespace, c.selector, func(err error) { fmt.Fprintf(a.io.Err, "rampart: left out of the view: %v\n", err) })
	if err != nil {
		return nil, fmt.Errorf("--cluster: %w", err)
	}
	return r, nil
}

// flowSource is where flows and endpoints are read: this node's agent (its API client)
// or, with --cluster, every node's.
type flowSource interface {
	ListEndpoints(ctx context.Context) ([]api.Endpoint, error)
	ListRemoteEndpoints(ctx context.Context) ([]api.RemoteEndpoint, error)
	Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error
}

// source is the agent's, or with --cluster the cluster's view.
func (a *app) source(c clusterFlags) (flowSource, error) {
	if !c.on {
		return a.client, nil
	}
	return a.relay(c)
}

// observeCluster is observe --cluster: req asked of every node's agent.
func (a *app) observeCluster(cmd *cobra.Command, c clusterFlags, req api.ObserveRequest, output string) error {
	r, err := a.relay(c)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(a.io.Out)
	return r.Observe(contextOf(cmd), req, func(f api.Flow) error {
		switch output {
		case "json":
			return enc.Encode(f)
		case "jsonpb":
			return writeHubbleJSON(a.io.Out, f, f.Node)
		}
		_, err := fmt.Fprintf(a.io.Out, "[%s] %s\n", f.Node, FormatFlow(f))
		return err
	})
}

func (a *app) uiCommand() *cobra.Command {
	var (
		addr    string
		cluster clusterFlags
	)
	cmd := &cobra.Command{
		Use:   "ui [--address HOST:PORT] [--cluster]",
		Short: "Serve the live service map of this node's agent, or of the cluster, as a web page until interrupted",
		Long: `Serve the service map (docs/observability.md): endpoints grouped by namespace, the
edges between them by verdict with drop reasons, policies and L7 detail, and a flow table,
updating live. It reads this node's agent, or with --cluster every node's agent through the
API server. The page has no authentication: keep --address on localhost.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := a.source(cluster)
			if err != nil {
				return err
			}
			srv, err := servicemap.Listen(addr, src, servicemap.Options{})
			if err != nil {
				return fmt.Errorf("--address: %w", err)
			}
			a.printf("serving the service map on http://%s/\n", srv.Addr())
			if err := srv.Serve(contextOf(cmd)); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "address", "127.0.0.1:12000", "where to serve the page, host:port")
	cluster.register(cmd.Flags(), "show the map")
	return cmd
}
