#!/usr/bin/env bash
# On a machine with a GPU, in one command: builds the wgpu backend, runs its
# whole test suite (accuracy against the reference engine, device-resident
# API, bad input) on the real adapter, then the decode benchmark, and
# prints decode bandwidth as a fraction of the device's measured copy
# bandwidth, and the 30-layer step chained on the device against host calls.
#
#   bash benches/gpu-bench.sh                      # default adapter
#   WGPU_ADAPTER_NAME=h100 bash benches/gpu-bench.sh
#   KVSLICE_BENCH_CONTEXTS=8192,32768 bash benches/gpu-bench.sh
#
# Needs a Rust toolchain and a Vulkan (Linux; on NVIDIA the driver's Vulkan
# ICD), Metal (macOS) or DX12 (Windows) driver. It refuses to report a CPU
# adapter (lavapipe) as a GPU unless KVSLICE_GPU_ALLOW_CPU=1. Logs:
# target/gpu-tests.log, target/gpu-bench.log, target/criterion/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
started=$(date +%s)
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

# Only the wgpu feature of the bench crate: no model runner, Redis or ZeroMQ
# to build, so a fresh machine is measuring within a few minutes.
bench=(cargo bench -p kvslice-benches --no-default-features --features wgpu --bench wgpu_attention)

echo "== build"
cargo build --release -p kvslice-wgpu --tests
"${bench[@]}" --no-run

echo "== the wgpu test suite on the adapter"
tests=target/gpu-tests.log
KVSLICE_REQUIRE_GPU=1 cargo test --release -p kvslice-wgpu -- --nocapture 2>&1 | tee "$tests" \
  | grep -E '^test |test result|adapter' || true
if grep -q 'FAILED\|panicked' "$tests"; then
  echo "the test suite failed on this adapter; see $tests" >&2
  exit 1
fi
adapter=$(grep -m1 -o 'adapter .*' "$tests" || true)
echo "tested on: $adapter"
if [[ "$adapter" == *", Cpu,"* && "${KVSLICE_GPU_ALLOW_CPU:-0}" != 1 ]]; then
  echo "the adapter is a CPU (lavapipe?), not a GPU: is the GPU's Vulkan driver installed?" >&2
  echo "set WGPU_ADAPTER_NAME, or KVSLICE_GPU_ALLOW_CPU=1 to measure it anyway" >&2
  exit 1
fi

echo "== decode benchmark"
log=target/gpu-bench.log
"${bench[@]}" -- --noplot 2>&1 | tee "$log" >/dev/null

echo
echo "== summary (also in $log)"
sed -n '/^adapter:/p;/^device copy bandwidth/p;/^wgpu decode on/,/^[^ ]/p;/^wgpu decode by K\/V dtype/,/^[^ ]/p;/^30-layer/,$p' "$log" \
  | grep -v '^Benchmarking'
echo "took $(( $(date +%s) - started )) s"
