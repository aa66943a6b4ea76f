#!/usr/bin/env bash
# Packs what the GPU machine lacks into gpu-bundle/ (git-ignored; carry it with the `run` tool):
# stripped lockstep-trainer, lockstep-agent, gpu_test and gpu_kinds_test, the lockstep Python package and
# liblockstep-reporter, and the shared libraries they need that
# the GPU machine does not have (ZeroMQ, Gloo, OpenBLAS and their dependencies; see
# ../shared/gpu-machine/README.md), compressed to stay under the 64 MiB a run may carry.
#
#   bench/gpu/bundle.sh [BUILD_DIR]      then, on the GPU machine: bench/gpu/device_check.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build}
OUT=$ROOT/gpu-bundle
# On the GPU machine already (glibc and its parts, which must match its libc; the C++ runtime;
# CUDA's and NCCL's libraries; protobuf 32).
PRESENT='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libnsl|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl|libprotobuf)\.'

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in lockstep-trainer lockstep-agent gpu_test gpu_kinds_test; do
  [ -x "$BUILD/bin/$b" ] || { echo "bundle: $BUILD/bin/$b is missing: build with CUDA first" >&2; exit 1; }
  strip -o "$OUT/bin/$b" "$BUILD/bin/$b"
done
# The lockstep Python package beside bin/, where the agent looks for it, and the reporting library
# it falls back to in a Python without python3-zmq (the GPU machine's PyTorch venv).
cp -r "$BUILD/python" "$OUT/python"
find "$OUT/python" -name __pycache__ -prune -exec rm -rf {} +
cp -L "$BUILD/lib/liblockstep-reporter.so.0" "$OUT/lib/"
ldd "$OUT"/bin/* "$OUT/lib/liblockstep-reporter.so.0" | awk '$3 ~ /^\// { print $1, $3 }' | sort -u | while read -r name path; do
  [[ $name =~ $PRESENT ]] && continue
  cp -L "$path" "$OUT/lib/$name"
done
tar -C "$OUT" -cJf "$OUT/lib.tar.xz" lib
rm -rf "$OUT/lib"
du -sh "$OUT"/bin/* "$OUT/lib.tar.xz"
total=$(du -sm "$OUT" | cut -f1)
[ "$total" -lt 60 ] || { echo "bundle: $total MiB is over what a run may carry (64 MiB)" >&2; exit 1; }
echo "bundle: $OUT ($total MiB)"
