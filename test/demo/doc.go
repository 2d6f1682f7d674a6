// Package demo runs the README's demos as integration tests: the L3/L4 demo
// (scripts/demo.sh, policies in examples/demo) and the cluster demo
// (scripts/demo-cluster.sh, the marketplace of examples/marketplace on two nodes). Each to
// the end, where every outcome must be as expected, and interrupted with Ctrl-C half way,
// where it must stop at once, say so, report no outcome it did not check, exit 130 and
// leave nothing behind. Needs root (the cluster demo also the control plane's binaries,
// scripts/build-k8s.sh); with CI=true it fails instead of skipping.
package demo
