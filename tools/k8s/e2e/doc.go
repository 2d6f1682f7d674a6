// Package e2e builds upstream Kubernetes' NetworkPolicy end-to-end specs (the netpol
// package of k8s.io/kubernetes/test/e2e, v1.37.2) into a test binary of their own, as
// network plugins build it to judge themselves: `go test -c` of this package gives an
// e2e.test whose specs are the NetworkPolicy ones only. scripts/build-e2e.sh builds it.
package e2e
