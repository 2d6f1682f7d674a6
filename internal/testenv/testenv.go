package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// Suffix returns n random hex characters for unique names of namespaces, links and pins.
func Suffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

// Eventually polls cond until it holds or timeout passes.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
