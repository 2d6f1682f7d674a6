#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs every check and test: formatting, vet,
# generated BPF objects up to date, `go test` over all packages of the product module, of
# the bench module and of the examples module (bench/go.mod, examples/go.mod: modules of
# their own, which `./...` in the root does not reach), then each fuzz target
# for FUZZTIME (default 15s). Privileged tests need root; with CI=true they fail instead of
# skipping when they cannot run.
set -euo pipefail
# -h, --help: print the comment above and exit (what the README's check of its commands runs).
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/setup.sh
# The cluster tests' etcd, kube-apiserver and kubectl (cached by version; minutes on a fresh
# machine).
bash scripts/build-k8s.sh
# containerd (apt), crictl, the CNI loopback plugin and the sandbox image for test/containerd.
bash scripts/build-cri.sh
# kubelet, kube-proxy, kube-scheduler, kube-controller-manager, containerd 2, runc and the
# agnhost image for the real-node tests (test/realcluster; cached; minutes on a fresh machine).
bash scripts/build-node.sh
# CoreDNS, the real-node cluster's DNS, packed as an image (cached; about 4 min 45 s and
# 79 MB on a fresh machine).
bash scripts/build-coredns.sh
# upstream's NetworkPolicy e2e specs and the ginkgo CLI, for the conformance subset
# (test/conformance; cached; minutes on a fresh machine).
bash scripts/build-e2e.sh
# cyclonus, whose generated NetworkPolicy cases test/conformance's TestCyclonusSubset runs
# (cached; about 2 min 30 s on a fresh machine).
bash scripts/build-cyclonus.sh
# the hubble CLI, which cmd/rampartd's TestHubbleCLI runs against a real agent (cached).
bash scripts/build-hubble.sh

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
(cd bench && go vet ./...)
(cd examples && go vet ./...)
if [ -x scripts/check-generate.sh ]; then
	echo "== generated BPF objects up to date"
	bash scripts/check-generate.sh
fi
# go test runs GOTEST_P packages at once (default 3: on two cores two at a time left a
# third of the CPU idle, the tests waiting on clusters and timeouts; docs/testing.md) and
# starts them in the order given: the long packages first, so none of them starts last and
# makes the tail. The packages that start real nodes each take one of the host's four lab
# slots, so none of them waits for another.
slow_root="test/k8smode internal/datapath test/e2e test/demo test/conformance test/realcluster
	internal/cli test/l7 test/deploy test/taps internal/testenv/podrunner test/cluster
	cmd/rampartd internal/k8s/identities internal/monitor/suricata"
slow_bench="bench/egress bench/cluster bench/taps bench/l7 bench/policyoverhead
	bench/coldcost bench/propagation bench/services bench/applylatency"
slow_examples="examples/suggest"
# packages_longest_first SLOW...: the packages of the module here (go list ./...), the
# listed ones first in their order, then the rest in go list's order; a listed package
# that no longer exists is left out.
packages_longest_first() {
	local all p
	all=$(go list ./...)
	for p in "$@"; do
		grep -qxF "github.com/rampartnet/rampart/$p" <<<"$all" && echo "github.com/rampartnet/rampart/$p"
	done
	grep -vxF -f <(for p in "$@"; do echo "github.com/rampartnet/rampart/$p"; done) <<<"$all" || true
}
echo "== go test"
# shellcheck disable=SC2086,SC2046
go test -count=1 -timeout 30m -p "${GOTEST_P:-3}" "$@" $(packages_longest_first $slow_root)
echo "== go test (bench module: unit tests and a quick run of each benchmark)"
# shellcheck disable=SC2086,SC2046
(cd bench && go test -count=1 -timeout 30m -p "${GOTEST_P:-3}" "$@" $(packages_longest_first $slow_bench))
echo "== go test (examples module: the demos' programs and the tests that play their scenarios)"
# shellcheck disable=SC2086,SC2046
(cd examples && go test -count=1 -timeout 30m -p "${GOTEST_P:-3}" "$@" $(packages_longest_first $slow_examples))

# Each fuzz target runs for a short fixed time after the unit tests (which already ran its
# seed corpus and the regression cases under testdata/fuzz). -fuzz takes one target at a
# time (and spends at most 5s shrinking an input it found): the three targets run side by
# side, one fuzzing worker each. An input that fails is written
# under the package's testdata/fuzz/ and printed below: keep it there as a regression
# case. A run that fails with no input to blame (a fuzzing worker that did not answer in
# time on a loaded machine) is run once more.
echo "== fuzz (${FUZZTIME:=15s} per target)"
fuzz() { # package target
	local out new try
	for try in 1 2; do
		if out=$(go test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 5s -parallel 1 "$1" 2>&1); then
			echo "$2: $(echo "$out" | grep -E '^(ok|PASS)' | tail -n 1)"
			return
		fi
		new=$(git status --porcelain --untracked-files=all -- "$1/testdata/fuzz/$2" 2>/dev/null | grep '^??' || true)
		if [ -n "$new" ] || [ "$try" = 2 ] || echo "$out" | grep -qE 'Failing input written|seed corpus entry'; then
			echo "$out"
			echo "fuzz: $2 failed; new corpus files:"
			echo "$new"
			exit 1
		fi
		echo "$out" | grep -v '^fuzz: elapsed' | tail -n 5
		echo "fuzz: $2 failed without a failing input; once more"
	done
}
fuzzers=()
fuzz ./internal/policy FuzzParse &
fuzzers+=($!)
fuzz ./internal/cidrlist FuzzParseCIDRList &
fuzzers+=($!)
fuzz ./internal/proxy/http1 FuzzReadRequestHead &
fuzzers+=($!)
fuzz ./internal/fqdn FuzzCache &
fuzzers+=($!)
fuzz ./internal/dnsproxy FuzzResponse &
fuzzers+=($!)
failed=0
for pid in "${fuzzers[@]}"; do
	wait "$pid" || failed=1
done
exit "$failed"
