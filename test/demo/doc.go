// Package demo runs the README's L3/L4 demo (scripts/demo.sh, policies in examples/demo)
// as an integration test: to the end, where every outcome must be as expected, and
// interrupted with Ctrl-C half way, where it must stop at once, say so, report no outcome
// it did not check, exit 130 and leave nothing behind. Needs root; with CI=true it fails
// instead of skipping.
package demo
