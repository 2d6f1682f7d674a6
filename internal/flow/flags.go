package flow

import (
	"fmt"
	"strings"
)

// Has reports whether every flag of g is set in f.
func (f Flags) Has(g Flags) bool { return f&g == g }

// Names lists the names of f's flags in rampart.h's order (none for no flag); a bit
// rampart.h does not declare is "flag-0x..".
func (f Flags) Names() []string {
	var out []string
	left := f
	for _, g := range flagsOrder {
		if g != 0 && f.Has(g) {
			out = append(out, flagsNames[g])
			left &^= g
		}
	}
	for bit := Flags(1); left != 0; bit <<= 1 {
		if left&bit != 0 {
			out = append(out, fmt.Sprintf("flag-%#x", uint8(bit)))
			left &^= bit
		}
	}
	return out
}

// String is f's names joined by '|', or the name of FlagNone ("none") when no flag is set.
func (f Flags) String() string {
	if f == FlagNone {
		return flagsNames[FlagNone]
	}
	return strings.Join(f.Names(), "|")
}

// ParseFlags returns the flags named (case does not matter; "none" adds nothing).
func ParseFlags(names []string) (Flags, error) {
	var f Flags
	for _, n := range names {
		g, err := parseCode(flagsNames, flagsOrder, n, "flag")
		if err != nil {
			return 0, err
		}
		f |= g
	}
	return f, nil
}
