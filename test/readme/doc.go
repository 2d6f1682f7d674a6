// Package readme runs the README's commands as a user would: the shell block of its
// "Using it" section as pasted, in a network namespace of its own, so that the steps a new
// user reads are the steps that work (it fails when a command of the block fails, when an
// expected outcome, a denied connection, its trace and its flow, is missing, or when the
// block's uninstall leaves anything of its instance behind); and the commands of its first
// block, each executed by the path the README writes and asked for --help, so that a
// script that is not executable or does not start is caught without playing its demo (the
// full runs are in test/demo and test/starwars, by the same paths). Every script the docs
// name, and every file that starts with #!, must be executable; every relative link of the
// README and docs/ (docs/internals/ included) must name a file, and its anchor a heading. The walk-through of
// docs/taps.md (a mirror tap and Suricata through monitor run) runs as pasted like the
// "Using it" block. Both blocks need root, the walk-through Suricata too; with CI=true
// they fail instead of skipping.
package readme
