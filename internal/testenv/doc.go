// Package testenv is the bottom test-helper package: the rule for tests that need root or
// a tool (skip, or fail under CI=true), unique names, throwaway network namespaces and
// running code in one, sockets opened inside a namespace (TCP/UDP echo and HTTP servers,
// probes, clients) without switching the namespace of any goroutine the test owns, tools
// and binaries built for tests, and polling. It imports no Rampart package, so that the
// tests of every package can use it; the helpers that start an agent are in agenttest.
//
// Sockets belong to the namespace they were created in, so servers and clients are created
// on a locked, switched OS thread and then used from ordinary goroutines.
package testenv
