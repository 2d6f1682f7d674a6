// Package deploy tests the manifests of deploy/ against a real kube-apiserver with RBAC:
// that `kubectl apply -f deploy/ -R` is accepted, and that the agent's ClusterRole and Role
// are complete (the real watcher, identity allocator and collector, running as the
// ServiceAccount, sync and write everything they write) and minimal (without any one rule
// they fail).
package deploy
