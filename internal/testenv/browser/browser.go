// Package browser drives headless Chromium (Debian's package) for tests of web pages, and
// reads the DOM it dumps.
package browser

import (
	"bytes"
	"context"
	"html"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// Browser is headless Chromium with a profile of its own: other Chromiums may run on the
// machine.
type Browser struct {
	t        testing.TB
	chromium string
	profile  string
}

// New finds Chromium; a test without it is skipped (failed under CI).
func New(t testing.TB) *Browser {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testenv.SkipOrFail(t, "chromium not installed (scripts/setup.sh installs it): %v", err)
	}
	return &Browser{t: t, chromium: chromium, profile: t.TempDir()}
}

// Run runs Chromium headless with args (e.g. --dump-dom URL), giving the page's scripts
// 5 s of virtual time, and returns its output.
func (b *Browser) Run(args ...string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--user-data-dir=" + b.profile, "--virtual-time-budget=5000"}, args...)
	var out, errb bytes.Buffer
	c := exec.CommandContext(ctx, b.chromium, full...)
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		b.t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

var (
	tagRE  = regexp.MustCompile(`<([a-zA-Z]+)((?:\s+[^\s=>]+="[^"]*")*)\s*/?>`)
	attrRE = regexp.MustCompile(`([^\s=]+)="([^"]*)"`)
)

// Elements returns the attributes (unescaped) of the dumped DOM's tag elements that have
// the attribute has.
func Elements(dom, tag, has string) []map[string]string {
	var out []map[string]string
	for _, m := range tagRE.FindAllStringSubmatch(dom, -1) {
		if m[1] != tag {
			continue
		}
		attrs := map[string]string{}
		for _, a := range attrRE.FindAllStringSubmatch(m[2], -1) {
			attrs[a[1]] = html.UnescapeString(a[2])
		}
		if _, ok := attrs[has]; ok {
			out = append(out, attrs)
		}
	}
	return out
}

// Element returns the first tag element whose attributes have the values kv (name,
// value, ...), nil if none.
func Element(dom, tag string, kv ...string) map[string]string {
next:
	for _, e := range Elements(dom, tag, kv[0]) {
		for i := 0; i+1 < len(kv); i += 2 {
			if e[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return e
	}
	return nil
}

// Describe writes an element's attributes for a failure message.
func Describe(e map[string]string) string {
	if e == nil {
		return "absent"
	}
	var b strings.Builder
	for k, v := range e {
		b.WriteString(k + "=" + v + " ")
	}
	return b.String()
}
