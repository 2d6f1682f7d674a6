package datapath

// The BPF object is built by bpf2go from bpf/rampart.c; the generated Go and object files
// are committed, and scripts/check-generate.sh verifies that regenerating changes nothing.
// -mcpu=v3 for 32-bit atomics (conntrack flags). The multiarch include directories hold
// asm/types.h on Debian-like systems; the one that does not exist is ignored. The flow_*
// and drop_reason enums are the flow vocabulary, which internal/flow generates its types
// from (go generate ./internal/flow/ after this).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -type endpoint_info -type host_safe_key -type host_safe6_key -type endpoint_slot -type ipcache_key -type ipcache_value -type policy_key -type policy_value -type ct4_key -type ct6_key -type endpoint6 -type ct_value -type flow_cache_entry -type flow_cache6_entry -type frag_key -type frag_value -type ep_counters -type iface_stats -type flow_event -type flow_direction -type flow_verdict -type drop_reason -type flow_event_type -type flow_flag -type proxy_config -type cidr_config -type cidr6_key -type sv_pair_key -type tunnel_config -type tunnel_addr6 -type tap_rule -type tap_set -type tap_rule6 -type tap_set6 -type tap_flow_key -type tap_flow_key6 -type tap_flow_value -type tap_frag_value -type tap_stats -type tap_iface rampart ../../bpf/rampart.c -- -O2 -g -Wall -Werror -mcpu=v3 -I../../bpf/include -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu

// The socket-level Service translation (bpf/service.c) is an object of its own: cgroup
// sock_addr programs, attached apart from the tc programs and with their own maps.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -type svc_key -type svc_value -type svc_backend_key -type svc_backend -type svc_revnat_key -type svc_key6 -type svc_backend6 service ../../bpf/service.c -- -O2 -g -Wall -Werror -mcpu=v3 -I../../bpf/include -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
