// Package testenv holds helpers for privileged tests: the root check (skip, or fail under
// CI=true), unique names, and sockets opened inside a network namespace (TCP/UDP echo
// servers and probes) without switching the namespace of any goroutine the test owns.
//
// Sockets belong to the namespace they were created in, so servers and clients are created
// on a locked, switched OS thread and then used from ordinary goroutines.
package testenv
