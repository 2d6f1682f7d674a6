#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs every check and test: formatting, vet,
# generated BPF objects up to date, and `go test` over all packages. Privileged tests need
# root; with CI=true they fail instead of skipping when they cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/setup.sh

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
if [ -x scripts/check-generate.sh ]; then
	echo "== generated BPF objects up to date"
	bash scripts/check-generate.sh
fi
echo "== go test"
go test -count=1 -timeout 30m "$@" ./...
