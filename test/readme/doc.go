// Package readme runs the shell block of README.md's "Using it" section as a user would
// paste it, in a network namespace of its own, so that the steps a new user reads are the
// steps that work: it fails when a command of the block fails, when an expected outcome
// (a denied connection, its trace and its flow) is missing, or when the block's uninstall
// leaves anything of its instance behind. Needs root; with CI=true it fails instead of
// skipping.
package readme
