package egress

// The raw tc-eBPF LPM trie peer is built by bpf2go from bpf/lpm.c; the generated Go and
// object files are committed, and scripts/check-generate.sh verifies that regenerating
// changes nothing. The multiarch include directories hold asm/types.h on Debian-like
// systems; the one that does not exist is ignored.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -target bpfel -type lpm_key -type lpm6_key lpm bpf/lpm.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
