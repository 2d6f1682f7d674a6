// Command marketplace is the cluster demo's driver (scripts/demo-cluster.sh): it writes
// the marketplace's pods for a cluster of scripts/cluster.sh, probes every ordered pod
// pair from the source pod's network namespace and compares the matrix with
// examples/marketplace/expected.txt, and traces one denied cross-node pair.
package main
