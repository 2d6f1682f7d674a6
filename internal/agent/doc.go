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
// Subsystems (subsystem.go) are the parts of the agent that live in a package of their own
// and plug into that transaction as one step each, without importing the agent: taps, the
// tap policy and monitors (tapstep.go, internal/agent/taps) are the first. The step is the
// transaction's own phases and nothing else: load (restore its part of the model from the
// state file), compute (its part of the desired state, pure, where it may refuse the
// change), apply (old to new in the kernel, at the subsystems' place in applyOnce: after
// the ipcache's additions and before the endpoints' policy, so that a fail-closed tap is in
// place before a new endpoint's first packet; rollback is the same call from new to old,
// forced), save (its records into the state file, before the swap) and committed (told
// the swap happened). It is that small because that is all the transaction does with a
// part: validation is compute, rollback is apply backwards, and anything else a subsystem
// offers (the API's reads and writes of its part) goes through its package's own
// functions, called from the agent's glue file (tapstep.go), not through the step. A
// subsystem's kernel is its own small interfaces, which the kernel packages satisfy.
//
// CIDR sets (cidrsets.go, docs/cidrsets.md) are part of the model too, each stored in a file
// of its own (a binary base and an append-only journal, cidrsetfile.go): their content goes
// to the dataplane before the policy state that names them, and is emptied only after.
package agent
