package benchkit

import (
	"strconv"
	"strings"
)

func itoa(n int) string { return strconv.Itoa(n) }

func containsLine(s, line string) bool {
	for _, l := range strings.Split(s, "\n") {
		if l == line {
			return true
		}
	}
	return false
}
