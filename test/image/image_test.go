package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestBuildImage(t *testing.T) {
	testenv.RequireRoot(t) // chroot
	root := testenv.ModuleRoot(t)
	if out, err := exec.Command("python3", "-c", "import envoy").CombinedOutput(); err != nil {
		testenv.SkipOrFail(t, "no Envoy (scripts/setup.sh installs it): %v %s", err, out)
	}
	cache := t.TempDir()
	env := []string{"RAMPART_CACHE=" + cache}
	ref := strings.TrimSpace(run(t, root, nil, "bash", "scripts/build-image.sh", "--ref"))
	version := strings.TrimPrefix(ref, "rampart.io/rampart:")
	began := time.Now()
	archive := strings.TrimSpace(run(t, root, env, "bash", "scripts/build-image.sh"))
	t.Logf("built %s in %v", archive, time.Since(began).Round(time.Second))
	if want := filepath.Join(cache, "image", "rampart-"+version+".tar"); archive != want {
		t.Fatalf("archive %q, want %q", archive, want)
	}
	fi, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("archive %d MB", fi.Size()>>20)

	fsDir := filepath.Join(t.TempDir(), "rootfs")
	check := run(t, filepath.Join(root, "tools", "image"), nil, "go", "run", ".", "check", "--extract", fsDir, archive)
	lines := strings.Split(strings.TrimSpace(check), "\n")
	if len(lines) != 2 {
		t.Fatalf("check lists %d images, want 2 tags of one:\n%s", len(lines), check)
	}
	var digest string
	seen := map[string]bool{}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 6 || f[2] != "linux/amd64" || f[len(f)-1] != "entrypoint=/usr/local/bin/rampartd" {
			t.Fatalf("check line %q: want linux/amd64 and entrypoint /usr/local/bin/rampartd", line)
		}
		seen[f[0]] = true
		if digest != "" && f[1] != digest {
			t.Errorf("the tags name two images: %s and %s", digest, f[1])
		}
		digest = f[1]
	}
	if !seen[ref] || !seen["rampart.io/rampart:latest"] {
		t.Errorf("tags %v, want %s and rampart.io/rampart:latest", seen, ref)
	}

	// Each entrypoint runs from the image's files alone.
	chroot := func(args ...string) string { return run(t, root, nil, "chroot", append([]string{fsDir}, args...)...) }
	if out := chroot("/usr/local/bin/rampartd", "--version"); !strings.HasPrefix(out, "rampartd "+version+" ") {
		t.Errorf("rampartd --version in the image: %q, want version %s", out, version)
	}
	if out := chroot("/usr/local/bin/rampart", "--socket", "/none.sock", "version"); !strings.HasPrefix(out, "rampart "+version+" ") {
		t.Errorf("rampart version in the image: %q, want version %s", out, version)
	}
	if out := run(t, root, []string{"CNI_COMMAND=VERSION"}, "chroot", fsDir, "/usr/local/bin/rampart-cni"); !strings.Contains(out, `"supportedVersions":["1.0.0","1.1.0"]`) {
		t.Errorf("rampart-cni VERSION in the image: %q", out)
	}
	if out := chroot("/usr/local/bin/envoy", "--version"); !strings.Contains(out, "/1.40.0/") {
		t.Errorf("envoy --version in the image: %q, want 1.40.0", out)
	}

	// What the DaemonSet runs is in the image, at the paths it names.
	ds, err := os.ReadFile(filepath.Join(root, "deploy", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/usr/local/bin/rampartd", "/usr/local/bin/rampart", "/usr/local/bin/envoy"} {
		if !strings.Contains(string(ds), p) {
			t.Errorf("deploy/daemonset.yaml does not name %s", p)
		}
		if fi, err := os.Stat(filepath.Join(fsDir, p)); err != nil || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s in the image: %v, want an executable", p, err)
		}
	}
	if !strings.Contains(string(ds), "image: rampart.io/rampart:latest") {
		t.Error("deploy/daemonset.yaml does not run rampart.io/rampart:latest, the tag the build gives")
	}

	// Again: the same image (a clean tree is not built again; a dirty one is rebuilt to the
	// same digest, every file having the same time).
	if again := strings.TrimSpace(run(t, root, env, "bash", "scripts/build-image.sh")); again != archive {
		t.Fatalf("second build wrote %q, want %q", again, archive)
	}
	check2 := run(t, filepath.Join(root, "tools", "image"), nil, "go", "run", ".", "check", archive)
	if f := strings.Fields(check2); len(f) < 2 || f[1] != digest {
		t.Errorf("second build: %q, want digest %s", check2, digest)
	}
}
