package k8stest

import (
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
)

// Without the binaries Start skips the test, naming the missing binary and the script that
// builds it, or fails it when CI=true.
func TestStartWithoutBinaries(t *testing.T) {
	t.Setenv("RAMPART_K8S_BIN", t.TempDir())
	for _, tc := range []struct{ ci, want string }{{"", "skip: "}, {"true", "fail: "}} {
		t.Setenv("CI", tc.ci)
		ended := testenv.Ending(t, func(tb testing.TB) { Start(tb) })
		if !strings.HasPrefix(ended, tc.want) || !strings.Contains(ended, "etcd missing") || !strings.Contains(ended, "scripts/build-k8s.sh") {
			t.Errorf("CI=%q: Start ended with %q, want %s naming etcd and scripts/build-k8s.sh", tc.ci, ended, tc.want)
		}
	}
}
