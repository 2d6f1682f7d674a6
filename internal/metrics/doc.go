// Package metrics serves an agent's Prometheus metrics (rampartd --metrics-address;
// docs/observability.md lists them).
//
// Every metric is read from the agent when it is scraped, through Source, the few
// methods of the agent it needs: the status the CLI shows, the CIDR sets and tap
// contracts with their counters, and the agent's running counts (flow events and L7
// requests it read, apply times, endpoints' policy entries and counters, the latest
// counts each `rampart monitor run` reported of its monitor's alerts). Nothing is
// computed for metrics between scrapes, the dataplane does no work for them, and with no
// scraper they cost nothing. Each label takes values from a bounded set: names of the
// dataplane's vocabulary, or the node's own endpoints, sets, contracts and maps; never an
// address or a port.
package metrics
