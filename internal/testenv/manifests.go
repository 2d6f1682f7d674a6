package testenv

import _ "embed"

// AllowAToB80 is the NetworkPolicy of the cross-node scenarios of the end-to-end and
// Kubernetes-mode tests: x/b, selected by pod=b, admits x/a (pod=a) on port 80, TCP and
// UDP.
//
//go:embed manifests/allow-a-to-b-80.yaml
var AllowAToB80 string
