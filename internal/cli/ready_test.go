package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// fakeStatusAgent serves st as the agent's /v1/status on a Unix socket and returns the
// socket's path.
func fakeStatusAgent(t *testing.T, st *api.Status) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// status --ready, the DaemonSet's readiness probe: exit 0 from an agent outside
// Kubernetes mode and from one that applied the cluster's view; exit 1 with the reason
// while it has not (also when it fails), and when no agent answers.
func TestStatusReady(t *testing.T) {
	st := &api.Status{Instance: "default"}
	sock := fakeStatusAgent(t, st)
	ready := func() (string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), []string{"--socket", sock, "status", "--ready"}, IO{In: strings.NewReader(""), Out: &out, Err: &errb})
		return out.String() + errb.String(), code
	}
	if out, code := ready(); code != 0 || out != "ready\n" {
		t.Errorf("agent outside Kubernetes mode: exit %d, %q; want 0, ready", code, out)
	}
	st.Kubernetes = &api.KubernetesStatus{NodeName: "n1"}
	if out, code := ready(); code != 1 || !strings.Contains(out, "not ready: the cluster's view is not applied yet") {
		t.Errorf("agent not synced: exit %d, %q; want 1 and the reason", code, out)
	}
	st.Kubernetes.Failing, st.Kubernetes.LastError = true, "listing pods: forbidden"
	if out, code := ready(); code != 1 || !strings.Contains(out, "listing pods: forbidden") {
		t.Errorf("agent failing: exit %d, %q; want 1 and its last error", code, out)
	}
	st.Kubernetes = &api.KubernetesStatus{NodeName: "n1", Synced: true}
	if out, code := ready(); code != 0 || out != "ready\n" {
		t.Errorf("agent synced: exit %d, %q; want 0, ready", code, out)
	}
	sock = filepath.Join(t.TempDir(), "none.sock")
	if out, code := ready(); code == 0 {
		t.Errorf("no agent: exit 0, %q; want a failure", out)
	}
}
