// Package agent is the core of rampartd: it owns the model (namespaces, endpoints,
// policies, identities), persists it atomically, turns every change into a desired
// dataplane state with the pure mapstate computation, applies that state through the
// datapath, and decorates and fans out flow events.
//
// Every change follows the same transaction: build the new model on a copy, compute the
// desired state from it (parsing and validation happen here, before anything is touched),
// make the kernel changes (endpoint namespaces, then ipcache additions, endpoints' policy,
// ipcache deletions), persist, and only then make the copy the live model. A failure at
// any step undoes the steps before it, so the running policy and the stored state stay as
// they were.
//
// CIDR sets (cidrsets.go, docs/cidrsets.md) are part of the model too, each stored in a file
// of its own (a binary base and an append-only journal, cidrsetfile.go): their content goes
// to the dataplane before the policy state that names them, and is emptied only after.
package agent
