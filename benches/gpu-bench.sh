#!/usr/bin/env bash
# Builds and runs the wgpu decode benchmark on this machine's GPU and prints
# decode bandwidth as a fraction of the device's measured copy bandwidth.
#
#   bash benches/gpu-bench.sh                 # default adapter, contexts 1k/8k/32k
#   WGPU_ADAPTER_NAME=h200 bash benches/gpu-bench.sh
#   KVSLICE_BENCH_CONTEXTS=8192 bash benches/gpu-bench.sh
#
# Needs a Rust toolchain and a Vulkan (Linux), Metal (macOS) or DX12
# (Windows) driver. Results: stdout/stderr and target/criterion/.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
log=target/gpu-bench.log
mkdir -p target
cargo bench -p kvslice-benches --bench wgpu_attention -- --noplot 2>&1 | tee "$log"
echo
echo "== summary (also in $log)"
sed -n '/^adapter:/p;/^device copy bandwidth/p;/^wgpu decode on/,$p' "$log"
