// Package l7plan is the one definition of what L7 (HTTP) rules let through: the proxy
// configures Envoy from it, the proxy's fast path checks requests with it, and the kernel's
// send-side verdict gets its tables from it (internal/l7table). Keeping it in one pure
// package is what makes the three agree; tests compare it with the dataplane's own
// decisions (mapstate.Lookup) and the others with it.
//
// BuildPlan derives a Plan from the desired dataplane state alone: the proxy listener's
// filter chains (one per endpoint, direction and port with L7 rules, and one per pair of
// such endpoints on a port), each with the authorisation (Authz) of the source's egress
// and the destination's ingress, as grants of peer address sets and HTTP rules. Plan.Chain
// picks a connection's chain as Envoy does; Authz.Allows and Plan.Allows decide a request
// with the semantics the Envoy configuration has. Compile prepares a plan for deciding
// many requests (literal rules as string comparisons, the others one RE2 match).
//
// The agent builds the plan once per change and hands it to the proxy and to the
// send-side verdict. It is plain Go: no kernel, Envoy or gRPC (test/layers checks).
package l7plan
