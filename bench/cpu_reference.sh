#!/usr/bin/env bash
# The CPU reference benchmark (issue 2): lockstep-trainer against PyTorch DDP (gloo), alternately,
# on the same machine in one run. Prints figures and ratios; record them in docs/benchmarks.md.
#
#   bench/cpu_reference.sh [--rounds N] [--steps N]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/lockstep.sh" build >&2
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch python3-numpy >&2
fi
exec /usr/bin/python3 "$ROOT/bench/cpu_reference.py" --trainer "${LOCKSTEP_BUILD_DIR:-$ROOT/build}/bin/lockstep-trainer" \
  --torch-script "$ROOT/../shared/reference/torch_cpu_reference.py" "$@"
