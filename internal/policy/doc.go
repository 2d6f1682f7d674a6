// Package policy turns policy manifests (Kubernetes NetworkPolicy, CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, and Cilium's JSON rule arrays) into normalised Rules.
//
// Parsing is strict: every field of the input is either understood or rejected with an
// error that names the file, the document and the field path. Nothing is ignored silently,
// so a policy is never half-understood. The package is pure (no kernel access).
package policy
