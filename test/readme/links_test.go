package readme

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
)

// docFiles returns README.md and every Markdown file under docs/, relative to root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	mdHeading  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdCode     = regexp.MustCompile("`[^`]*`")
	anchorDrop = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// mdLines calls fn with each line of a Markdown file outside fenced code blocks.
func mdLines(t *testing.T, path string, fn func(n int, line string)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	fence := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			fn(n, line)
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a Markdown file: the heading
// in lower case, punctuation dropped, spaces as '-', a repeated one suffixed -1, -2, ...
func anchors(t *testing.T, path string) map[string]bool {
	out, seen := map[string]bool{}, map[string]int{}
	mdLines(t, path, func(_ int, line string) {
		m := mdHeading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		a := strings.ReplaceAll(anchorDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[2])), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	})
	return out
}

// Every relative link of the README and the docs names a file of the repository, and
// every anchor a heading of the file it names: docs move, and a link left behind would
// send a reader nowhere.
func TestDocLinksResolve(t *testing.T) {
	root := testenv.ModuleRoot(t)
	cache := map[string]map[string]bool{}
	checked := 0
	for _, doc := range docFiles(t, root) {
		mdLines(t, filepath.Join(root, doc), func(n int, line string) {
			for _, m := range mdLink.FindAllStringSubmatch(mdCode.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, ":") && !strings.HasPrefix(target, "#") {
					continue // a URL
				}
				checked++
				file, frag, _ := strings.Cut(target, "#")
				path := filepath.Join(root, doc)
				if file != "" {
					path = filepath.Join(root, filepath.Dir(doc), file)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: %s: %v", doc, n, target, err)
					continue
				}
				if frag == "" || !strings.HasSuffix(path, ".md") {
					continue
				}
				if cache[path] == nil {
					cache[path] = anchors(t, path)
				}
				if !cache[path][frag] {
					t.Errorf("%s:%d: %s: no heading with anchor #%s", doc, n, target, frag)
				}
			}
		})
	}
	if checked < 50 {
		t.Errorf("checked only %d links; is the link pattern still right?", checked)
	}
}
