// Package marketplace is the digital marketplace scenario as code: its organisations, the
// namespaces and labels of their pods, and the table of the pairs each scenario allows
// (expected.txt). The cluster demo's driver (cmd/marketplace) and the tests that play
// the scenario on one agent (examples/suggest) share it, so that both play the same one.
package marketplace

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Orgs are the organisations.
var Orgs = []string{"a", "b", "c"}

// Namespace is the namespace of an organisation's pods: org-<x>. Its label org=<x> is in
// 00-organisations.yaml.
func Namespace(org string) string { return "org-" + org }

// PodLabels are the labels of an organisation's pods, which the scenarios' policies
// select: id.pod=Organization<X>.
func PodLabels(org string) map[string]string {
	return map[string]string{"id.pod": "Organization" + strings.ToUpper(org)}
}

// Port is the TCP port every pod serves (agnhost netexec) and the scenarios admit.
const Port = 8080

// Pairs are the allowed organisation pairs of a scenario: source, destination.
type Pairs map[[2]string]bool

// ReadExpected reads the table of allowed organisation pairs: per line a scenario name,
// then its allowed "x->y" pairs, or "*" for all; '#' starts a comment.
func ReadExpected(path string) (map[string]Pairs, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the expected table: %w", err)
	}
	defer f.Close()
	table := map[string]Pairs{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		pairs := Pairs{}
		for _, p := range fields[1:] {
			if p == "*" {
				for _, x := range Orgs {
					for _, y := range Orgs {
						pairs[[2]string{x, y}] = true
					}
				}
				continue
			}
			x, y, ok := strings.Cut(p, "->")
			if !ok || !slices.Contains(Orgs, x) || !slices.Contains(Orgs, y) {
				return nil, fmt.Errorf("%s:%d: %q: want x->y with x, y in a, b, c, or *", path, line, p)
			}
			pairs[[2]string{x, y}] = true
		}
		table[fields[0]] = pairs
	}
	return table, sc.Err()
}
