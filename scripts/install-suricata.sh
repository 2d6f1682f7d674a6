#!/usr/bin/env bash
# Installs Suricata 7 (the flow taps' monitor, internal/monitor/suricata) from Debian
# bookworm-backports: bookworm itself ships Suricata 6, which lacks the pgsql parser the tap
# demo needs. Idempotent: does nothing when a Suricata 7 is already installed. Needs root.
set -euo pipefail

suricata_ok() {
	local v
	v=$(suricata -V 2>/dev/null) && [[ "$v" == *"version 7."* ]]
}
if command -v suricata >/dev/null 2>&1 && suricata_ok; then
	exit 0
fi

# The backports suite comes from the same mirror (and snapshot, and keyring) as the
# machine's own Debian sources: copy their first stanza and change only its suites.
src=/etc/apt/sources.list.d/debian.sources
bp=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -f "$bp" ]; then
	if [ ! -f "$src" ]; then
		echo "install-suricata: $src not found: cannot derive the bookworm-backports source" >&2
		exit 1
	fi
	awk 'NF == 0 { exit } { print }' "$src" |
		sed -E 's/^Suites:.*/Suites: bookworm-backports/' >"$bp.tmp"
	grep -q '^Suites: bookworm-backports$' "$bp.tmp" ||
		{ echo "install-suricata: no Suites line in the first stanza of $src" >&2; rm -f "$bp.tmp"; exit 1; }
	mv "$bp.tmp" "$bp"
fi

echo "install-suricata: installing suricata from bookworm-backports"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq -t bookworm-backports suricata >/dev/null
# The package's own service would sniff the machine's default interface: Rampart starts
# its monitors itself, each with its own configuration.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
	systemctl disable --now suricata >/dev/null 2>&1 || true
fi
suricata_ok || { echo "install-suricata: suricata 7 did not install: $(suricata -V 2>&1 | head -n 1)" >&2; exit 1; }
echo "install-suricata: $(suricata -V)"
