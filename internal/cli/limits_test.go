package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
)

// countingApply is an agent that counts the manifests it is sent.
type countingApply struct {
	api.Service
	calls int
}

func (c *countingApply) Apply(context.Context, api.ApplyRequest) (api.ChangeResult, error) {
	c.calls++
	return api.ChangeResult{}, nil
}

// TestApplyRefusesOverLimits: `rampart apply -f` refuses a manifest over a limit of package
// policy before sending anything, with the message the agent gives (which names the file).
func TestApplyRefusesOverLimits(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deep := strings.Repeat("[", 2_000_000)
	deepFile := write("deep.json", deep)
	_, agentErr := policy.Parse(deepFile, []byte(deep))
	big := strings.Repeat("#\n", policy.MaxManifestBytes/2+10)
	bigFile := write("big.yaml", big)
	half := strings.Repeat(strings.Repeat("#\n", 1<<19)+"---\n", 4) // documents of 1 MiB
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	write("sub/a.yaml", half)
	write("sub/b.yaml", half+"#\n")
	docs := write("docs.yaml", strings.Repeat("---\n", policy.MaxDocuments+1)+"a: 1\n")

	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"deep JSON", "", []string{"-f", deepFile}, "Error: " + agentErr.Error() + "\n"},
		{"large file", "", []string{"-f", bigFile}, "Error: " + bigFile + ": manifest size 8388628 bytes exceeds the limit of 8388608 bytes\n"},
		{"large stdin", big, []string{"-f", "-"}, "Error: -: manifest size 8388628 bytes exceeds the limit of 8388608 bytes\n"},
		{"directory over the total", "", []string{"-f", sub}, fmt.Sprintf("Error: request (2 manifests): manifest size %d bytes exceeds the limit of 8388608 bytes\n", 2*len(half)+2)},
		{"too many documents", "", []string{"-f", docs}, "Error: " + docs + ": document 10001 (line 10001): number of documents 10001 exceeds the limit of 10000\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &countingApply{}
			_, stderr, code := runFake(t, svc, tc.stdin, append([]string{"apply"}, tc.args...)...)
			if code == 0 || stderr != tc.want {
				t.Errorf("exit %d, stderr %q\nwant %q", code, stderr, tc.want)
			}
			if svc.calls != 0 {
				t.Errorf("the manifests were sent to the agent")
			}
		})
	}
	if !strings.Contains(agentErr.Error(), "deep.json: document 1 (line 1): nesting depth 65 exceeds the limit of 64") {
		t.Errorf("agent error %q", agentErr)
	}
}
