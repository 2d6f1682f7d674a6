package agent

// subsystem is a part of the agent that plugs into every change (doc.go, "Subsystems"):
// the transaction's steps, each given the old and the new state whole, of which the
// subsystem reads its own part and what it needs of the rest. Its part of the model is
// fields of model, copied by clone; its part of the desired state a field of desired.
type subsystem interface {
	// load puts the subsystem's records of the state file into the model being restored.
	load(st *stateFile, m *model) error
	// compute derives the subsystem's part of d, the desired state of m, once d's policy
	// state is computed; prev is the live desired state (nil at start). Pure: an error
	// refuses the change before anything is touched.
	compute(m *model, d, prev *desired) error
	// apply moves the kernel from old's part to new's, in the subsystems' place in
	// applyOnce (after the ipcache's additions, before the endpoints' policy); force:
	// whatever is installed (start, rollback, repair). A failed change is undone by
	// apply(new, old, true), so apply takes either direction.
	apply(old, new *desired, force bool) error
	// save puts the subsystem's records of m and d into the state file, which persist
	// writes before new becomes live.
	save(m *model, d *desired, st *stateFile)
	// committed is told that new (persisted) is the live state in place of old.
	committed(old, new *desired)
}
