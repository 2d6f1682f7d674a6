package cniinstall

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// fakePlugin writes a file standing for the plugin binary.
func fakePlugin(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rampart-cni")
	if err := os.WriteFile(p, []byte(content), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// runtimeConfs is what a container runtime finds in confDir: the files libcni lists and
// their parsed lists (an error for a file that does not parse).
func runtimeConfs(t *testing.T, confDir string) (map[string]*libcni.NetworkConfigList, error) {
	t.Helper()
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, err
	}
	out := map[string]*libcni.NetworkConfigList{}
	for _, f := range files {
		l, err := libcni.ConfListFromFile(f)
		if err != nil {
			return nil, err
		}
		out[filepath.Base(f)] = l
	}
	return out, nil
}

func TestInstallWritesPluginAndConflist(t *testing.T) {
	root := t.TempDir()
	bin, conf := filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d")
	opts := Options{Plugin: fakePlugin(t, "plugin v1"), BinDir: bin, ConfDir: conf, Socket: "/run/rampart/default.sock"}
	if err := Install(opts); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(bin, PluginName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("plugin mode %v, want 0755", fi.Mode().Perm())
	}
	if got, _ := os.ReadFile(filepath.Join(bin, PluginName)); string(got) != "plugin v1" {
		t.Errorf("plugin content %q, want the source's", got)
	}
	confs, err := runtimeConfs(t, conf)
	if err != nil {
		t.Fatal(err)
	}
	l := confs[ConfName]
	if len(confs) != 1 || l == nil {
		t.Fatalf("runtime finds %v, want only %s", confs, ConfName)
	}
	if l.Name != NetworkName || l.CNIVersion != CNIVersion || len(l.Plugins) != 1 || l.Plugins[0].Network.Type != PluginName {
		t.Errorf("conflist %s: name %q version %q plugins %d, want %s %s one %s", l.Bytes, l.Name, l.CNIVersion, len(l.Plugins), NetworkName, CNIVersion, PluginName)
	}
	if !bytes.Contains(l.Plugins[0].Bytes, []byte(`"socket":"/run/rampart/default.sock"`)) {
		t.Errorf("plugin entry %s does not name the agent's socket", l.Plugins[0].Bytes)
	}

	// Again, with a new plugin and socket: both replaced, no temporary file left.
	opts.Plugin, opts.Socket = fakePlugin(t, "plugin v2"), "/run/rampart/other.sock"
	if err := Install(opts); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(bin, PluginName)); string(got) != "plugin v2" {
		t.Errorf("after reinstall the plugin is %q, want v2", got)
	}
	if got, _ := os.ReadFile(filepath.Join(conf, ConfName)); !strings.Contains(string(got), "/run/rampart/other.sock") {
		t.Errorf("after reinstall the conflist is %s, want the new socket", got)
	}
	for _, d := range []string{bin, conf} {
		ents, _ := os.ReadDir(d)
		if len(ents) != 1 {
			t.Errorf("%s holds %d entries, want 1 (no temporary files)", d, len(ents))
		}
	}

	if err := Uninstall(bin, conf); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(bin, PluginName), filepath.Join(conf, ConfName)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("after uninstall %s: %v, want it gone", p, err)
		}
	}
	if err := Uninstall(bin, conf); err != nil {
		t.Errorf("uninstalling twice: %v, want nil", err)
	}
}

// blockingReader yields half its data, then waits for release before the rest.
type blockingReader struct {
	first, rest []byte
	reached     chan struct{}
	release     chan struct{}
	n           int
}

func (r *blockingReader) Read(p []byte) (int, error) {
	switch r.n {
	case 0:
		r.n++
		return copy(p, r.first), nil
	case 1:
		r.n++
		close(r.reached)
		<-r.release
		return copy(p, r.rest), nil
	}
	return 0, io.EOF
}

// While a conflist is being written, the runtime sees nothing new in the directory (the
// temporary file is not a configuration to it), and the final name does not exist; after
// the rename it sees the whole list.
func TestHalfWrittenConflistIsNeverVisible(t *testing.T) {
	conf := t.TempDir()
	data, err := Conflist("/run/rampart/default.sock")
	if err != nil {
		t.Fatal(err)
	}
	r := &blockingReader{first: data[:len(data)/2], rest: data[len(data)/2:], reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- writeAtomic(filepath.Join(conf, ConfName), 0o644, r) }()
	<-r.reached
	ents, _ := os.ReadDir(conf)
	if len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), ".") {
		t.Errorf("while writing, the directory holds %v, want one hidden temporary file", ents)
	}
	confs, err := runtimeConfs(t, conf)
	if err != nil || len(confs) != 0 {
		t.Errorf("while writing, the runtime finds %v (error %v), want nothing", confs, err)
	}
	close(r.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	confs, err = runtimeConfs(t, conf)
	if err != nil || confs[ConfName] == nil || len(confs) != 1 {
		t.Fatalf("after writing, the runtime finds %v (error %v), want %s", confs, err, ConfName)
	}
}

// A runtime reading the directory while the agent reinstalls again and again always finds
// one whole, valid list.
func TestConcurrentReaderSeesWholeConflists(t *testing.T) {
	root := t.TempDir()
	opts := Options{Plugin: fakePlugin(t, "plugin"), BinDir: filepath.Join(root, "bin"), ConfDir: filepath.Join(root, "net.d"), Socket: "/run/rampart/a.sock"}
	if err := Install(opts); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var readErr error
	reads := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			confs, err := runtimeConfs(t, opts.ConfDir)
			if err == nil && (len(confs) != 1 || confs[ConfName] == nil) {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				readErr = err
				return
			}
			reads++
		}
	}()
	for i := 0; i < 200; i++ {
		opts.Socket = "/run/rampart/" + strings.Repeat("x", i) + ".sock"
		if err := Install(opts); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if readErr != nil {
		t.Fatalf("a reader found a partial or missing list after %d good reads: %v", reads, readErr)
	}
	if reads == 0 {
		t.Fatal("the reader never read")
	}
}

func TestErrorsNameThePath(t *testing.T) {
	root := t.TempDir()
	notDir := filepath.Join(root, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	plugin := fakePlugin(t, "plugin")
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"missing plugin", Options{Plugin: filepath.Join(root, "nope"), BinDir: root, ConfDir: root, Socket: "/s"}, filepath.Join(root, "nope")},
		{"plugin is a directory", Options{Plugin: root, BinDir: root, ConfDir: root, Socket: "/s"}, root + ": not a regular file"},
		{"bin dir is a file", Options{Plugin: plugin, BinDir: notDir, ConfDir: root, Socket: "/s"}, notDir},
		{"conf dir is a file", Options{Plugin: plugin, BinDir: filepath.Join(root, "bin"), ConfDir: notDir, Socket: "/s"}, notDir},
		{"relative socket", Options{Plugin: plugin, BinDir: root, ConfDir: root, Socket: "s.sock"}, `socket "s.sock"`},
	} {
		err := Install(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	// The conflist's place taken by a non-empty directory: uninstall names it.
	conf := filepath.Join(root, "net.d")
	if err := os.MkdirAll(filepath.Join(conf, ConfName, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(filepath.Join(root, "bin"), conf); err == nil || !strings.Contains(err.Error(), filepath.Join(conf, ConfName)) {
		t.Errorf("uninstall: error %v, want one naming %s", err, filepath.Join(conf, ConfName))
	}
}
