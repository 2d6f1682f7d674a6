package flow

import (
	"fmt"
	"strconv"
	"strings"
)

func (t EventType) String() string { return codeName(eventTypeNames, t, "event") }
func (v Verdict) String() string   { return codeName(verdictNames, v, "verdict") }
func (r Reason) String() string    { return codeName(reasonNames, r, "reason") }

// ParseEventType returns the event type named s (case does not matter).
func ParseEventType(s string) (EventType, error) {
	return parseCode(eventTypeNames, eventTypeOrder, s, "event type")
}

// ParseVerdict returns the verdict named s (case does not matter: "dropped" is DROPPED).
func ParseVerdict(s string) (Verdict, error) {
	return parseCode(verdictNames, verdictOrder, s, "verdict")
}

// ParseReason returns the drop reason named s (case does not matter).
func ParseReason(s string) (Reason, error) {
	return parseCode(reasonNames, reasonOrder, s, "reason")
}

// VerdictNames lists the verdicts' names in rampart.h's order.
func VerdictNames() []string { return names(verdictNames, verdictOrder) }

// codeName is c's name; a code rampart.h does not declare (an object newer than this
// build) is what and its number, e.g. "reason-11".
func codeName[T ~uint8](names map[T]string, c T, what string) string {
	if n, ok := names[c]; ok {
		return n
	}
	return what + "-" + strconv.Itoa(int(c))
}

func parseCode[T ~uint8](m map[T]string, order []T, s, what string) (T, error) {
	for _, c := range order {
		if strings.EqualFold(m[c], s) {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown %s %q: want one of %s", what, s, strings.Join(names(m, order), ", "))
}

func names[T ~uint8](m map[T]string, order []T) []string {
	out := make([]string, len(order))
	for i, c := range order {
		out[i] = m[c]
	}
	return out
}
