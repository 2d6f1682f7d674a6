// Package deploy holds Rampart's Kubernetes manifests: what `kubectl apply -f deploy/ -R`
// installs into a cluster (docs/install.md). The CustomResourceDefinitions in crds/ have no
// other copy: this package embeds them for internal/k8s/crds, which installs them from Go
// (tests, scripts/cluster.sh). It imports nothing of Rampart's.
package deploy

import "embed"

// CRDs holds crds/*.yaml, the CustomResourceDefinitions.
//
//go:embed crds/*.yaml
var CRDs embed.FS
