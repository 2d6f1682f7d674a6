// Package cli is the rampart command line: noun commands that read (list, get, observe,
// trace) and verb commands that change state (add, delete, label, apply, cidrset load), all talking to
// the agent through internal/api. It is a package, not a main, so tests run commands
// in-process with Run.
package cli
