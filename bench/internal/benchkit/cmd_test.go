package benchkit

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The benchmarks build the agent from the product module of this checkout, which the
// bench module reaches through its replace directive: run from the bench module (as the
// tests are), AgentBinDir must find it, build both binaries and remove them afterwards.
func TestAgentBinDirBuildsTheProduct(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, cleanup, err := AgentBinDir(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rampartd", "rampart"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s not built as an executable: %v", name, err)
		}
	}
	cleanup()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cleanup left %s: %v", dir, err)
	}

	given := t.TempDir()
	got, cleanup, err := AgentBinDir(ctx, given)
	if err != nil || got != given {
		t.Fatalf("AgentBinDir(%q) = %q, %v; want the directory given", given, got, err)
	}
	cleanup()
	if _, err := os.Stat(given); err != nil {
		t.Errorf("cleanup removed the directory it was given: %v", err)
	}
}

func TestSplitList(t *testing.T) {
	if got := SplitList(" a, ,b,,c "); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("SplitList = %q", got)
	}
	if got := SplitList(""); got != nil {
		t.Errorf("SplitList(\"\") = %q, want nil", got)
	}
}
