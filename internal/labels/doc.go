// Package labels holds label sets and Kubernetes-style label selectors (matchLabels and
// matchExpressions). It is pure: no kernel, no I/O.
//
// Endpoint label sets are flattened: an endpoint carries its own labels plus its namespace
// name and its namespace's labels under well-known keys (see KeyNamespace), so every
// namespace rule of NetworkPolicy and CiliumNetworkPolicy becomes a plain selector.
package labels
