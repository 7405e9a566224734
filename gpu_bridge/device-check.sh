#!/usr/bin/env bash
# Run by hand on a machine with an NVIDIA GPU and its driver (never by CI): builds the CUDA
# backend and runs gpu_bridge/examples/device_check.rs, which measures the bridge's copy
# bandwidth into device pages against a raw cuMemcpyHtoDAsync of the same bytes (target >= 0.9)
# and checks fencing on device memory (stale generation and epoch refused, the page untouched,
# reuse refused while leased, a byte-exact round trip), a pool opened from an IPC handle in
# another process, and a staged Load whose unfilled page is left untouched. Exit 0: every check
# held; 1: a check failed; 2: no usable device. Needs only a Rust toolchain: libcuda is loaded
# at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "device-check: no nvidia-smi; this script needs a machine with an NVIDIA GPU" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cargo run --release --locked -p orbitkv-gpu-bridge --features cuda --example device_check
