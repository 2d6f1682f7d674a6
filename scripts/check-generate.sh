#!/bin/sh
# Regenerates the bpf2go output (internal/datapath/rampart_bpfel.{go,o} and
# internal/sockverdict/sockverdict_bpfel.{go,o}) from bpf/, and the
# egress benchmark's raw LPM peer (bench/egress/lpm_bpfel.{go,o}) from bench/egress/bpf/,
# into the tree and fails if anything differs from what is committed: the committed object
# must be what the committed C source builds to. Needs clang and llvm-strip (the object
# bytes depend on the clang version; the project's machines all have the same one).
set -eu
cd "$(dirname "$0")/.."

go generate ./internal/datapath/ ./internal/sockverdict/ ./bench/egress/

status=0
if ! git diff --exit-code --stat -- 'internal/datapath/*_bpfel.*' 'internal/sockverdict/*_bpfel.*' 'bench/egress/*_bpfel.*'; then
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
	echo "check-generate: generated BPF files (or their sources) are not committed as built; run 'go generate ./internal/datapath/ ./internal/sockverdict/ ./bench/egress/' and commit bpf/, bench/egress/bpf/ and the generated files" >&2
	exit 1
fi
echo "check-generate: generated BPF files are up to date"
