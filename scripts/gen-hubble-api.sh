#!/usr/bin/env bash
# Generates internal/hubble's Go API packages (flowpb, observerpb, relaypb) from Hubble's
# .proto files: api/v1/{flow,observer,relay} of github.com/cilium/cilium at $HUBBLE_VERSION
# (tools/hubble/versions.env), copied verbatim under internal/hubble/proto/ and compiled with
# protoc (apt protobuf-compiler), protoc-gen-go (the google.golang.org/protobuf of go.mod)
# and protoc-gen-go-grpc ($GRPC_GEN_VERSION below).
#
# Why not import cilium's generated packages: requiring the github.com/cilium/cilium module
# raises, through its go.mod, github.com/vishvananda/netlink from v1.3.1 to an untagged
# pseudo-version (about 4,400 changed lines in the library every kernel-edge package
# uses), for two generated packages that need none of it. The messages, their proto
# packages and the service keep Hubble's names, so the wire format, the gRPC method paths
# and the JSON are Hubble's.
#
#   scripts/gen-hubble-api.sh            regenerate from the .proto files here
#   scripts/gen-hubble-api.sh --update   copy the .proto files of $HUBBLE_VERSION first
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tools/hubble/versions.env
. "$root/tools/hubble/versions.env"
GRPC_GEN_VERSION=v1.6.2
proto="$root/internal/hubble/proto"
pkg=github.com/rampartnet/rampart/internal/hubble

if [ "${1:-}" = "--update" ]; then
	src="$(go mod download -json "github.com/cilium/cilium@$HUBBLE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
	for p in flow observer relay; do
		mkdir -p "$proto/$p"
		cp "$src/api/v1/$p/$p.proto" "$proto/$p/$p.proto"
		chmod 644 "$proto/$p/$p.proto"
	done
	echo "$HUBBLE_VERSION" >"$proto/VERSION"
fi
command -v protoc >/dev/null || { echo "gen-hubble-api: protoc missing (apt-get install protobuf-compiler)" >&2; exit 1; }

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
(cd "$root" && GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go)
GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$GRPC_GEN_VERSION"

# Each .proto's Go package is ours (M options), its proto package Hubble's.
m=""
for p in flow observer relay; do
	m+=",M$p/$p.proto=$pkg/${p}pb;${p}pb"
	mkdir -p "$root/internal/hubble/${p}pb"
done
out="$(mktemp -d)"
trap 'rm -rf "$bin" "$out"' EXIT
PATH="$bin:$PATH" protoc -I "$proto" -I /usr/include \
	--go_out="$out" --go_opt="${m#,}" \
	--go-grpc_out="$out" --go-grpc_opt="${m#,}" \
	flow/flow.proto observer/observer.proto relay/relay.proto
for p in flow observer relay; do
	rm -f "$root/internal/hubble/${p}pb/"*.pb.go
	cp "$out/$pkg/${p}pb/"*.go "$root/internal/hubble/${p}pb/"
done
echo "gen-hubble-api: generated internal/hubble/{flowpb,observerpb,relaypb} from Hubble $(cat "$proto/VERSION")"
