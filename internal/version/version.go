// Package version says which build of Rampart is running: the module version and the VCS
// revision Go stamps into every binary it builds from a checkout, or a version set at link
// time.
package version

import (
	"runtime/debug"
	"strings"
)

// Version and Revision, when set at link time (go build -ldflags "-X
// github.com/rampartnet/rampart/internal/version.Version=v1.2.3 -X
// github.com/rampartnet/rampart/internal/version.Revision=$(git rev-parse HEAD)"), replace
// the build info's module version and VCS revision (which Go records only when it builds
// with -buildvcs from a checkout it can read).
var Version, Revision string

// Info is a build's identity.
type Info struct {
	Version   string `json:"version"`            // module version; "(devel)" for a build from a checkout
	Revision  string `json:"revision,omitempty"` // VCS revision of the checkout
	Modified  bool   `json:"modified,omitempty"` // the checkout had uncommitted changes
	GoVersion string `json:"goVersion"`
}

// Get reads the running binary's build info.
func Get() Info {
	var i Info
	if bi, ok := debug.ReadBuildInfo(); ok {
		i.Version = bi.Main.Version
		i.GoVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if Version != "" {
		i.Version = Version
	}
	if Revision != "" {
		i.Revision, i.Modified = Revision, false
	}
	if i.Version == "" {
		i.Version = "unknown"
	}
	return i
}

// String is one line: "v1.2.3 (revision 0123abc, modified) go1.24.1".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	if i.Revision != "" {
		b.WriteString(" (revision " + i.Revision)
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	if i.GoVersion != "" {
		b.WriteString(" " + i.GoVersion)
	}
	return b.String()
}
