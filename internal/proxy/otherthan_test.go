package proxy

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// otherThan(v) must match (as a whole) exactly the strings that are not v: the header rule
// "every occurrence equals v" is built from its negation.
func TestOtherThan(t *testing.T) {
	values := []string{"landing", "a", "x-y", `a\b`, "[^]", "a.b*c", "empire ship", "héllo", "--", "^$"}
	alphabet := []rune{'a', 'b', 'l', 'x', '-', '\\', '[', ']', '^', '.', '*', ' ', 'é', '\xff'}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, v := range values {
		re := regexp.MustCompile("^(?:" + otherThan(v) + ")$")
		probes := []string{v, "", v + "x", v + v, v[:len(v)-1], "x" + v, v + "," + v}
		for range 300 {
			n := rnd.IntN(len(v) + 3)
			r := make([]rune, n)
			for i := range r {
				if i < len([]rune(v)) && rnd.IntN(3) > 0 {
					r[i] = []rune(v)[i] // mostly v's own characters: near misses
				} else {
					r[i] = alphabet[rnd.IntN(len(alphabet))]
				}
			}
			probes = append(probes, string(r))
		}
		for _, s := range probes {
			if got, want := re.MatchString(s), s != v; got != want {
				t.Errorf("otherThan(%q) matches %q: %v, want %v (expression %s)", v, s, got, want, otherThan(v))
			}
		}
	}
}
