// Package flow is Rampart's flow vocabulary and the decoded flow event: the event types,
// verdicts, drop reasons and flags of the dataplane's flow events, one Go type each, with
// the names users see (observe, the API), and Event, a flow event as the datapath's reader
// decodes it and the agent consumes it.
//
// The codes are C enums in bpf/include/rampart.h; vocabulary_gen.go is generated from them
// (go generate, through the BTF of internal/datapath/rampart_bpfel.o; see internal/gen), so
// Go holds no copy to keep in sync. A code's name is its enumerator without the prefix, in
// lower case with '-' for '_' (REASON_SPOOFED_SOURCE: "spoofed-source"); verdicts are in
// upper case (FORWARDED). Code 0 is named "none" (ReasonNone, FlagNone); the event type and
// the verdict have no code 0. The direction is policy.Direction, checked at compile time
// against enum flow_direction.
//
// Plain Go: no BPF library, so the API and the CLI can use it.
package flow

//go:generate go run ./internal/gen -btf ../datapath/rampart_bpfel.o -o vocabulary_gen.go
