#!/bin/sh
# Regenerates the bpf2go output (internal/datapath/rampart_bpfel.{go,o},
# internal/datapath/service_bpfel.{go,o} and internal/sockverdict/sockverdict_bpfel.{go,o})
# from bpf/, the flow vocabulary
# (internal/flow/vocabulary_gen.go) from its enums, and the
# egress benchmark's raw LPM peer (bench/egress/lpm_bpfel.{go,o}) from bench/egress/bpf/,
# into the tree and fails if anything differs from what is committed: the committed object
# must be what the committed C source builds to. Needs clang and llvm-strip (the object
# bytes depend on the clang version; the project's machines all have the same one).
set -eu
cd "$(dirname "$0")/.."

go generate ./internal/datapath/ ./internal/sockverdict/
(cd bench && go generate ./egress/) # the bench module (bench/go.mod)
# The flow vocabulary is generated from the enums in the object just built.
go generate ./internal/flow/

status=0
if ! git diff --exit-code --stat -- 'internal/datapath/*_bpfel.*' 'internal/sockverdict/*_bpfel.*' 'bench/egress/*_bpfel.*'; then
	status=1
fi
if ! git diff --exit-code --stat -- internal/flow/vocabulary_gen.go || [ -n "$(git ls-files --others -- internal/flow/vocabulary_gen.go)" ]; then
	echo "internal/flow/vocabulary_gen.go is not what the enums of bpf/include/rampart.h generate"
	status=1
fi
untracked=$(git ls-files --others --exclude-standard -- 'internal/datapath/*_bpfel.*' 'internal/sockverdict/*_bpfel.*' 'bench/egress/*_bpfel.*')
if [ -n "$untracked" ]; then
	echo "untracked generated files: $untracked"
	status=1
fi
# A source file that is not committed (a new header) builds here but not from a clean
# checkout, so the committed object would not be reproducible.
untracked_src=$(git ls-files --others --exclude-standard -- 'bpf/*.c' 'bpf/*.h' 'bench/egress/bpf/*.c')
if [ -n "$untracked_src" ]; then
	echo "untracked BPF sources: $untracked_src"
	status=1
fi
if [ "$status" -ne 0 ]; then
	echo "check-generate: generated BPF files (or their sources) are not committed as built; run 'go generate ./internal/datapath/ ./internal/sockverdict/', 'go generate ./internal/flow/' and '(cd bench && go generate ./egress/)' and commit bpf/, bench/egress/bpf/ and the generated files" >&2
	exit 1
fi
echo "check-generate: generated BPF files are up to date"
