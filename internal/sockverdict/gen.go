package sockverdict

// The BPF object is built by bpf2go from bpf/sockverdict.c; the generated Go and object
// files are committed, and scripts/check-generate.sh verifies that regenerating changes
// nothing. -mcpu=v3 as for the tc object (internal/datapath/gen.go).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -type sv_conn_key -type sv_target_key -type sv_target -type sv_masks -type sv_table -type sv_path_key -type sv_host_key -type sv_header_key -type sv_header_val -type sv_conn -type sv_event -type sv_flow_key sockverdict ../../bpf/sockverdict.c -- -O2 -g -Wall -Werror -mcpu=v3 -I../../bpf/include -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
