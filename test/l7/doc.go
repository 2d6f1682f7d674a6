// Package l7 tests L7 (HTTP and gRPC) policy through the whole real path: an agent
// (agenttest.StartAgent) in its own node namespace, BPF steering at the client's veth, the
// agent's Envoy with its RBAC rules, and servers that record every request and every byte
// they receive, so that a test can assert not only what the client got but that a refused
// request never reached the server.
//
// Covered: method, path, host and header matching (regex anchoring, case rules, host with
// and without port, query strings, path normalisation as docs/policy-language.md
// promises), peers, allowed and denied requests on one kept-alive connection, HTTP/1.1
// request smuggling and malformed or oversized requests, non-HTTP bytes on an L7 port, a
// gRPC method allow-list over h2c, rules added, changed and removed under traffic, and
// Envoy killed under traffic (fail closed, non-L7 ports unaffected, service resumes).
//
// Known bugs of the L7 path have tests that skip, saying why, unless RAMPART_KNOWN_BUGS=1
// (they then fail until the bug is fixed): see docs/architecture.md, "Limits".
//
// The tests need root and Envoy (scripts/setup.sh installs it); without them they skip,
// and with CI=true they fail instead. Run: sudo go test ./test/l7/ (about a minute).
package l7
