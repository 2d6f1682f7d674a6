package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv/root"
)

// RequireRoot skips the test when not running as root, or fails it when CI=true (CI must
// run every privileged test).
func RequireRoot(t testing.TB) {
	t.Helper()
	root.Require(t)
}

// Suffix returns n random hex characters for unique names of namespaces, links and pins.
func Suffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}
