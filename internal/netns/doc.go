// Package netns runs code inside a network namespace and creates new ones.
//
// In Go a network namespace belongs to an OS thread, not to a goroutine or the process: a
// goroutine that switches namespace and is then moved to another thread, or a thread that is
// given back to the scheduler still inside another namespace, makes unrelated code open
// sockets and netlink handles in the wrong place. Every product package that needs another
// namespace (the endpoint plumbing, the dataplane's per-namespace sysctls and attachments,
// the proxy's fast path, the send-side verdict's namespace cookies) goes through this one
// helper, which keeps the switch on a dedicated, locked thread and discards a thread it
// could not switch back.
package netns
