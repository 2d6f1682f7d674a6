// Package policy turns policy manifests (Kubernetes NetworkPolicy, CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, and Cilium's JSON rule arrays) into normalised Rules.
//
// Parsing is strict: every field of the input is either understood or rejected with an
// error that names the file, the document and the field path. Nothing is ignored silently,
// so a policy is never half-understood. The package is pure (no kernel access).
//
// Entry points: ParseDocuments (bytes read from a named source) and ParsePath (a file, a
// directory, or "-" for stdin). Errors in a manifest are *ParseError values; Format renders
// parsed rules for people and golden tests. docs/policy-language.md describes what is
// supported and the semantic choices (namespace scoping, default deny, CIDR peers, named
// ports, L7 HTTP rules).
//
// Namespace scoping is folded into selectors over the well-known keys of package labels
// (io.kubernetes.pod.namespace and io.cilium.k8s.namespace.labels.*), so later stages only
// match selectors against full endpoint label sets.
package policy
