#!/usr/bin/env bash
# Builds here, where the Rust toolchain is, everything the device run needs on a GPU machine
# that has neither a toolchain nor a package registry: into target/device-run (ignored), which
# travels with the working tree (`carry`). Release builds: `orbitkv` with the CUDA backend, the
# device check, the bridge's CUDA unit tests, the daemon's device-pool tests; and the package's
# abi3 wheel. Fails when the folder would not stay well under the 64 MiB that travels.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/device-run
limit=$((48 << 20))
rm -rf "$out"
mkdir -p "$out/bin"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols

cargo build --release --locked -p orbitkv --features cuda --bin orbitkv
cargo build --release --locked -p orbitkv-gpu-bridge --features cuda --example device_check
cp target/release/orbitkv target/release/examples/device_check "$out/bin/"

# Test executables, named as cargo names them: one line of JSON per built artifact.
tests() {
    cargo test --release --locked --no-run --message-format=json "$@" |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])'
}
while read -r name exe; do
    cp "$exe" "$out/bin/test-gpu_bridge-$name"
done < <(tests -p orbitkv-gpu-bridge --features cuda --lib)
while read -r name exe; do
    cp "$exe" "$out/bin/test-manager-$name"
done < <(tests -p orbitkv-manager --features cuda --test register_device_pool \
    --test device_pool_end_to_end)

# The wheel of this tree (one in target/wheels may be of another), with scripts/test's maturin.
venv=.venv-python
if [ ! -x "$venv/bin/maturin" ]; then
    echo "no maturin in $venv: run scripts/test first" >&2
    exit 1
fi
PATH="$PWD/$venv/bin:$PATH" CARGO_TARGET_DIR=target/wheel maturin build --locked --release \
    --zig --compatibility manylinux2014 -m adapters/python/Cargo.toml --out "$out"

ls -l "$out" "$out/bin"
size=$(du -sb "$out" | cut -f1)
echo "device run: $size bytes to carry (limit $limit)"
if [ "$size" -gt "$limit" ]; then
    echo "target/device-run is $size bytes: over the $limit-byte limit" >&2
    exit 1
fi
