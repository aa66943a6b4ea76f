#!/usr/bin/env bash
# Runs a fuzzer (protocol or store) for a while on a fresh corpus seeded from the current schema.
#   run_fuzz.sh SEEDS_PROGRAM FUZZER SECONDS
set -euo pipefail
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"$1" "$corpus"
# -timeout: one input may take at most 10 s (a hang is a failure); -rss_limit_mb: no blow-up.
"$2" -max_total_time="$3" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$corpus"
