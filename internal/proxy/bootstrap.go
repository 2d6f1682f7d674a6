package proxy

import (
	"encoding/json"
	"fmt"
	"time"
)

// bootstrapConfig is Envoy's static configuration: the node id, the admin interface and the
// control plane on Unix sockets (the agent may run in another network namespace than
// Envoy; filesystem sockets do not care), the ORIGINAL_DST cluster, and LDS over ADS.
// Everything that depends on policy comes over xDS.
type bootstrapConfig struct {
	NodeID       string
	AdminSocket  string
	ControlSock  string
	ConnectLimit time.Duration // upstream connect timeout
}

func (b bootstrapConfig) json() ([]byte, error) {
	pipe := func(path string) map[string]any {
		return map[string]any{"pipe": map[string]any{"path": path}}
	}
	h2 := map[string]any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": map[string]any{
			"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
			"explicit_http_config": map[string]any{"http2_protocol_options": map[string]any{}},
		},
	}
	cfg := map[string]any{
		"node": map[string]any{"id": b.NodeID, "cluster": "rampart"},
		"admin": map[string]any{
			"address": pipe(b.AdminSocket),
		},
		"dynamic_resources": map[string]any{
			"ads_config": map[string]any{
				"api_type":              "GRPC",
				"transport_api_version": "V3",
				"grpc_services":         []any{map[string]any{"envoy_grpc": map[string]any{"cluster_name": ClusterControl}}},
			},
			"lds_config": map[string]any{"ads": map[string]any{}, "resource_api_version": "V3"},
		},
		"static_resources": map[string]any{
			"clusters": []any{
				map[string]any{
					"name":                             ClusterControl,
					"type":                             "STATIC",
					"connect_timeout":                  "1s",
					"typed_extension_protocol_options": h2,
					"load_assignment": map[string]any{
						"cluster_name": ClusterControl,
						"endpoints": []any{map[string]any{"lb_endpoints": []any{
							map[string]any{"endpoint": map[string]any{"address": pipe(b.ControlSock)}},
						}}},
					},
				},
				map[string]any{
					"name":            ClusterOriginalDst,
					"type":            "ORIGINAL_DST",
					"lb_policy":       "CLUSTER_PROVIDED",
					"connect_timeout": fmt.Sprintf("%.3fs", b.ConnectLimit.Seconds()),
					// Upstream speaks what the client spoke: HTTP/1.1 stays HTTP/1.1, h2c
					// (gRPC) stays HTTP/2.
					"typed_extension_protocol_options": map[string]any{
						"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": map[string]any{
							"@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
							"use_downstream_protocol_config": map[string]any{
								"http_protocol_options":  map[string]any{},
								"http2_protocol_options": map[string]any{},
							},
						},
					},
				},
			},
		},
		"layered_runtime": map[string]any{
			"layers": []any{map[string]any{
				"name": "rampart",
				"static_layer": map[string]any{
					// Policies may carry regular expressions larger than Envoy's default
					// program size limit; RE2 runs in linear time whatever their size.
					"re2.max_program_size.error_level": 100000,
					"re2.max_program_size.warn_level":  100000,
				},
			}},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}
