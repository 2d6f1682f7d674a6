// Package npa runs the ClusterNetworkPolicy conformance tests of SIG Network's
// network-policy-api v0.3.0 (sigs.k8s.io/network-policy-api/conformance) against the
// cluster of RAMPART_NPA_KUBECONFIG; test/conformance's TestNetworkPolicyAPI starts a
// cluster of real nodes and runs this package's TestNPASuite in it with go test -json.
package npa

import (
	"embed"
	"regexp"
	"strings"
)

// Manifests is upstream's base manifests (conformance/base of v0.3.0, Apache-2.0), the
// file system the suite applies from, with base/manifests.yaml adapted by Adapt.
// TestManifestsMatchUpstream checks the copy; go test -run TestManifestsMatchUpstream
// -update rewrites it from the module cache's.
//
//go:embed base
var Manifests embed.FS

var (
	bashAgnhost = regexp.MustCompile(`^(\s*)command: \["/bin/bash", "-c", "/agnhost ([^"]*)"\]$`)
	clientLine  = regexp.MustCompile(`^(\s*)- name: \S+-client$`)
)

// Adapt makes upstream's base/manifests.yaml run on the labs' agnhost image, which is the
// agnhost binary alone (scripts/lib/build.sh's pack_image: no /bin/bash, no CMD), where
// upstream's image is a Debian base with bash and CMD ["pause"]:
//
//   - a server's `command: ["/bin/bash", "-c", "/agnhost ARGS"]` becomes
//     `command: ["/agnhost", ARGS...]` (the kubelet expands $(HOST_IP) in a command as
//     bash did);
//   - a client container (`-client`, no command: the image's CMD, pause) gets
//     `command: ["/agnhost", "pause"]`;
//   - the SCTP servers (`agnhost porter` with SERVE_SCTP_PORT_*) run `agnhost pause`:
//     this kernel has no SCTP, porter exits when it cannot listen and the pods would never
//     be Ready. The SCTP tests are skipped.
//
// The containers, their names, ports and servers' arguments are upstream's.
func Adapt(upstream string) string {
	lines := strings.SplitAfter(upstream, "\n")
	var b strings.Builder
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSuffix(lines[i], "\n")
		if m := bashAgnhost.FindStringSubmatch(line); m != nil {
			args := []string{"pause"}
			if m[2] != "porter" {
				args = splitArgs(m[2])
			}
			b.WriteString(m[1] + `command: ["/agnhost", "` + strings.Join(args, `", "`) + `"]` + "\n")
			continue
		}
		b.WriteString(lines[i])
		if m := clientLine.FindStringSubmatch(line); m != nil && i+1 < len(lines) &&
			strings.HasPrefix(strings.TrimSpace(lines[i+1]), "image: ") {
			i++
			b.WriteString(lines[i])
			b.WriteString(m[1] + `  command: ["/agnhost", "pause"]` + "\n")
		}
	}
	return b.String()
}

// splitArgs splits a command line at spaces, keeping a template action ({{ ... }}) whole.
func splitArgs(s string) []string {
	var args []string
	var cur strings.Builder
	depth := 0
	for _, f := range strings.Split(s, " ") {
		if cur.Len() > 0 {
			cur.WriteString(" ")
		}
		cur.WriteString(f)
		depth += strings.Count(f, "{{") - strings.Count(f, "}}")
		if depth == 0 {
			args = append(args, cur.String())
			cur.Reset()
		}
	}
	if cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return args
}
