// Package servicemap serves an agent's live service map (rampartd --ui-address): a
// read-only web page of the node's endpoints grouped by namespace, the edges between them
// aggregated from recent flows by verdict (drops with their reason and the policy that
// decided, L7 requests with method, path and status), and a filterable table of the last
// flows. docs/observability.md ("Service map") describes it.
//
// The page is plain HTML, CSS and JavaScript embedded in the binary (no build step, no
// third-party code), drawn in SVG from two JSON endpoints it polls: /api/map and
// /api/flows. Everything it shows comes from the agent's flow hub, which the map follows
// as `rampart observe --follow` does (Source.Observe), and from its endpoint list: the
// dataplane does no work for it. The aggregation is bounded: at most Options.MaxEdges
// edges (the least recently seen one goes first), each with a bounded number of details,
// and the last Options.MaxFlows flows; what the bounds pushed out is counted and shown.
//
// The server answers GET (and HEAD) only and has no authentication: it is meant for
// localhost or behind a proxy that adds it.
package servicemap
