package metrics

import "github.com/prometheus/client_golang/prometheus"

// allDescs are the descriptions of every metric, for Describe (a fixed set: the registry
// checks what Collect sends against it).
var allDescs []*prometheus.Desc

func desc(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	allDescs = append(allDescs, d)
	return d
}

// The metrics, in the order of docs/observability.md.
var (
	descSourceUp  = desc("rampart_scrape_source_up", "Whether this scrape could read the part of the agent's state named by source (1) or not (0; its metrics are absent).", "source")
	descBuildInfo = desc("rampart_build_info", "The agent's build, in the version label; always 1.", "version")

	// The model.
	descEndpoints  = desc("rampart_endpoints", "Endpoints on this node.")
	descPolicies   = desc("rampart_policies", "Policies the agent holds.")
	descIdentities = desc("rampart_identities", "Identities allocated (reserved identities not counted).")
	descDegraded   = desc("rampart_degraded", "1 while a failed dataplane update could not be rolled back (rampart status says why), else 0.")

	// Flows.
	descFlows        = desc("rampart_flows_total", "Flow events of the dataplane the agent read (new connections and drops), by event type, verdict, drop reason, direction at the endpoint and protocol.", "type", "verdict", "reason", "direction", "protocol")
	descObserverLost = desc("rampart_observe_flows_lost_total", "Flows that followers slower than the flows did not get: `rampart observe --follow`, Hubble clients and the service map, summed.")

	// Policy and the dataplane.
	descApplyDuration   = desc("rampart_policy_apply_duration_seconds", "Time of each move of the dataplane to a newly computed state: one per change (policy, endpoint, CIDR set, Kubernetes view...), and one per rollback.")
	descApplyFailures   = desc("rampart_policy_apply_failures_total", "Dataplane applies that failed (and were rolled back).")
	descPolicyEntries   = desc("rampart_endpoint_policy_entries", "Entries of an endpoint's policy in the dataplane's policy map (shared by the node's endpoints; its capacity is rampart_bpf_map_max_entries{map=\"policy\"}).", "endpoint")
	descEndpointPackets = desc("rampart_endpoint_packets_total", "Packets forwarded into (ingress) and out of (egress) an endpoint since it was installed on its interface.", "endpoint", "direction")
	descEndpointBytes   = desc("rampart_endpoint_bytes_total", "Bytes forwarded into (ingress) and out of (egress) an endpoint since it was installed on its interface.", "endpoint", "direction")
	descEndpointDrops   = desc("rampart_endpoint_dropped_packets_total", "Packets the dataplane dropped into (ingress) and out of (egress) an endpoint.", "endpoint", "direction")
	descMapBytes        = desc("rampart_bpf_map_memory_bytes", "Memory of a BPF map of the dataplane, as the kernel accounts it (memlock; for an LPM trie its nodes' keys and values only).", "map", "type")
	descMapMaxEntries   = desc("rampart_bpf_map_max_entries", "Capacity of a BPF map of the dataplane, in entries.", "map", "type")
	descCIDRSetPrefixes = desc("rampart_cidr_set_prefixes", "Prefixes of a CIDR set, by family.", "set", "family")

	// L7.
	descL7Requests         = desc("rampart_l7_requests_total", "HTTP requests the L7 checks decided, by verdict, reason (l7-denied, l7-error) and checker (proxy: Envoy or the agent's fast path; send-side).", "verdict", "reason", "checker")
	descL7Duration         = desc("rampart_l7_request_duration_seconds", "Time of the L7 requests from the first request byte to the last response byte.")
	descProxyState         = desc("rampart_l7_proxy_state", "The L7 proxy's state: 1 for the current one, 0 for the others.", "state")
	descProxyRestarts      = desc("rampart_l7_proxy_restarts_total", "Times the agent restarted Envoy after it exited.")
	descFastPathRequests   = desc("rampart_l7_fastpath_requests_total", "Requests the agent's HTTP/1.1 fast path checked.")
	descFastPathDenied     = desc("rampart_l7_fastpath_denied_total", "Requests the fast path refused (403).")
	descFastPathHandedOver = desc("rampart_l7_fastpath_handed_over_total", "Connections the fast path handed to Envoy.")
	descFastPathOpen       = desc("rampart_l7_fastpath_open_connections", "Connections the fast path holds open.")
	descSendSidePairs      = desc("rampart_l7_sendside_pairs", "Pairs of local endpoints and ports the send-side verdict checks.")
	descSendSideRequests   = desc("rampart_l7_sendside_requests_total", "Requests the send-side verdict decided, by result: passed, refused (403), outside-subset (400), send-failed.", "result")
	descSendSideEventsLost = desc("rampart_l7_sendside_events_lost_total", "Send-side requests not reported because the event ring was full.")

	// DNS.
	descDNSQueries    = desc("rampart_dns_queries_total", "DNS queries the DNS proxy read.")
	descDNSResults    = desc("rampart_dns_query_results_total", "DNS queries by what the DNS proxy did: allowed (by rules.dns), refused, forwarded, upstream-error (SERVFAIL: no answer), learn-error (SERVFAIL: learnt addresses not applied).", "result")
	descDNSDrops      = desc("rampart_dns_queries_dropped_total", "DNS queries the DNS proxy dropped, by reason.", "reason")
	descFQDNNames     = desc("rampart_fqdn_names", "Names learnt from DNS answers (toFQDNs).")
	descFQDNAddresses = desc("rampart_fqdn_addresses", "Distinct addresses learnt from DNS answers.")
	descFQDNEvicted   = desc("rampart_fqdn_evicted_total", "Learnt names the cache's bounds evicted.")

	// Taps and monitors.
	descTapMirroredPackets   = desc("rampart_tap_mirrored_packets_total", "Copies a mirror contract handed to its monitor's interface.", "tap")
	descTapMirroredBytes     = desc("rampart_tap_mirrored_bytes_total", "Bytes of the copies a mirror contract handed to its monitor's interface.", "tap")
	descTapRedirectedPackets = desc("rampart_tap_redirected_packets_total", "Packets a redirect contract diverted through its inline monitor.", "tap")
	descTapRedirectedBytes   = desc("rampart_tap_redirected_bytes_total", "Bytes of the packets a redirect contract diverted through its inline monitor.", "tap")
	descTapCopiesLost        = desc("rampart_tap_copies_lost_total", "Copies a mirror contract's monitor could not take (gone, down, backlog full).", "tap")
	descTapDropped           = desc("rampart_tap_dropped_packets_total", "Packets of a redirect contract dropped, by reason: not-returned (the monitor kept them), monitor-unavailable (fail closed).", "tap", "reason")
	descMonitors             = desc("rampart_monitors", "Monitor endpoints on this node.")
	descMonitorsDown         = desc("rampart_monitors_down", "Monitor endpoints on this node that are not reading their receive interface.")
	descMonitorRemoteCopies  = desc("rampart_monitor_remote_copies_total", "Copies other nodes' mirror contracts sent to monitors here, by result: delivered, lost (no monitor here has their key).", "result")
	descMonitorNotDiverted   = desc("rampart_monitor_not_diverted_packets_total", "Packets monitors sent back that belong to no diverted flow (dropped).")

	// What monitor run reads from its monitor's EVE file, counted since it started.
	descMonitorAlerts             = desc("rampart_monitor_alerts_total", "Alerts of a monitor, by the tap contract the join attributed them to (empty: none) and severity (1-4), since its monitor run started.", "monitor", "contract", "severity")
	descMonitorDrops              = desc("rampart_monitor_drops_total", "Packets an inline monitor dropped (its drop records), since its monitor run started.", "monitor")
	descMonitorCapturePackets     = desc("rampart_monitor_capture_packets_total", "Packets the kernel handed to a monitor's Suricata (capture.kernel_packets), since its monitor run started.", "monitor")
	descMonitorCaptureKernelDrops = desc("rampart_monitor_capture_kernel_drops_total", "Packets the kernel dropped because a monitor's capture ring was full (capture.kernel_drops), since its monitor run started.", "monitor")
	descMonitorLastReport         = desc("rampart_monitor_last_report_timestamp_seconds", "When the agent received a monitor's latest report from monitor run, in seconds since the epoch.", "monitor")

	// Kubernetes mode.
	descK8sSynced       = desc("rampart_kubernetes_synced", "1 when the informers synced and the last view was applied, else 0.")
	descK8sFailing      = desc("rampart_kubernetes_sync_failing", "1 when the last view could not be built or applied (the dataplane enforces the last one that was), else 0.")
	descK8sSyncs        = desc("rampart_kubernetes_syncs_total", "Views of the cluster applied.")
	descK8sWatchErrors  = desc("rampart_kubernetes_watch_errors_total", "Errors of the watch (e.g. the API server unreachable).")
	descK8sSyncFailures = desc("rampart_kubernetes_sync_failures_total", "Views of the cluster that could not be built or applied.")
	descK8sLastSync     = desc("rampart_kubernetes_last_sync_timestamp_seconds", "When the last view was applied, in seconds since the epoch.")
	descK8sPropagation  = desc("rampart_kubernetes_propagation_duration_seconds", "Time from the watcher learning of a change (its informer event) to the view holding it applied, per view.")
	descK8sRefused      = desc("rampart_kubernetes_refused_objects", "Policy objects the parser refused in the last view.")
	descK8sProblems     = desc("rampart_kubernetes_problem_objects", "Objects left out of the last view.")
	descK8sUnresolved   = desc("rampart_kubernetes_unresolved_pods", "Pods whose cluster identity disagrees with another pod's.")
	descK8sQuarantined  = desc("rampart_kubernetes_quarantined_addresses", "Addresses of deleted pods not handed out again yet.")
	descK8sNodes        = desc("rampart_kubernetes_nodes", "Other nodes of the cluster.")
	descK8sRemotes      = desc("rampart_kubernetes_remote_endpoints", "Pods on other nodes.")
)
