package readme

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
)

// The README's first block is what a new user runs first, by the paths it writes: each
// command must be an executable file of the repository that starts when executed by that
// very path, not only when handed to bash. It runs each with --help, which every one of
// them answers with its description and nothing else; the demos' and the test script's
// full runs, through the same paths, are in test/demo, test/starwars and CI.
func TestReadmeFirstBlockCommandsStart(t *testing.T) {
	root := testenv.ModuleRoot(t)
	lines := shBlock(t, filepath.Join(root, "README.md"), "")
	if len(lines) < 4 {
		t.Fatalf("README.md's first block has %d lines, want the four commands", len(lines))
	}
	for _, line := range lines {
		cmdline, _, _ := strings.Cut(line, "#")
		fields := strings.Fields(cmdline)
		if len(fields) != 1 {
			t.Errorf("README.md: %q: want one command with no arguments, as this test runs it", line)
			continue
		}
		path := fields[0]
		t.Run(path, func(t *testing.T) {
			fi, err := os.Stat(filepath.Join(root, path))
			if err != nil {
				t.Fatalf("README.md names %s: %v", path, err)
			}
			if fi.Mode().Perm()&0o111 == 0 {
				t.Errorf("%s is not executable (mode %v): running it as the README says fails with permission denied", path, fi.Mode().Perm())
			}
			// A script that does not answer --help would run whole (set up the machine,
			// play a demo): refuse to start it here.
			if b, err := os.ReadFile(filepath.Join(root, path)); err != nil || !strings.Contains(string(b), "--help)") {
				t.Fatalf("%s does not answer --help (%v): this test only starts it that way", path, err)
			}
			cmd := exec.Command(path, "--help")
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s --help, run as the README writes it: %v\n%s", path, err, out)
			}
			if len(strings.TrimSpace(string(out))) == 0 {
				t.Errorf("%s --help printed nothing", path)
			}
		})
	}
}

// scriptRef is a script of the repository named in the documentation.
var scriptRef = regexp.MustCompile(`(?:^|[\s(\x60])((?:scripts|bench|examples|test)/[A-Za-z0-9_./-]+\.(?:sh|py))\b`)

// Every script the README or the docs name, and every file of the repository that starts
// with #!, is executable: a user runs them by their paths.
func TestScriptsAreExecutable(t *testing.T) {
	root := testenv.ModuleRoot(t)
	named := map[string]string{} // script -> a document naming it
	for _, doc := range docFiles(t, root) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range scriptRef.FindAllStringSubmatch(string(b), -1) {
			named[m[1]] = filepath.Base(doc)
		}
	}
	if len(named) < 5 {
		t.Fatalf("found %d scripts named in the docs, want the demos, the setup and the benchmarks: %v", len(named), named)
	}
	for script, doc := range named {
		fi, err := os.Stat(filepath.Join(root, script))
		if err != nil {
			t.Errorf("%s names %s: %v", doc, script, err)
		} else if fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s names %s, which is not executable (mode %v)", doc, script, fi.Mode().Perm())
		}
	}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		head := make([]byte, 2)
		_, rerr := f.Read(head)
		f.Close()
		if rerr != nil || string(head) != "#!" {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o111 == 0 {
			rel, _ := filepath.Rel(root, p)
			t.Errorf("%s starts with #! but is not executable (mode %v)", rel, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}
