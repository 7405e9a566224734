#!/usr/bin/env bash
# Runs on the GPU machine, with target/device-run (from build.sh) carried beside the working
# tree: every step under its own timeout, everything printed also kept in one log
# ($OUT/device-run.log when OUT is set, else target/device-run.log). Steps: the GPU's identity
# and PCIe link; the device check twice; the PyTorch engine stand-in (KV tensors in the shapes
# vLLM's planner gives a dense, a hybrid and an MLA model, exported through `_share_cuda_`,
# registered with `orbitkv serve` through the package, loaded back by another process), again
# with a DRAM tier smaller than a Publish so the daemon reuses evicted copies' memory; the
# bridge's CUDA unit tests; the daemon's device-pool tests, end to end included.
# Exit 0: every step passed; 1: one failed; 2: no GPU here (each step that needs one refuses
# with 2, which is what CI checks).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=target/device-run
log="${OUT:-target}/device-run.log"
mkdir -p "$(dirname "$log")"
exec > >(tee -a "$log") 2>&1
[ -d "$dir/bin" ] || { echo "no $dir: run gpu_bridge/device-run/build.sh first"; exit 1; }

failed=0
no_device=0
# step NAME SECONDS COMMAND...: runs the command under a timeout; exit 2 is "no device".
step() {
    local name=$1 limit=$2
    shift 2
    echo "==> $name"
    local start=$SECONDS rc
    # A step may be a function of this script: run in a shell that has them (exported below).
    timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"
    rc=$?
    echo "<== $name: exit $rc after $((SECONDS - start)) s"
    case $rc in
        0) ;;
        2) no_device=1 ;;
        *) failed=1 ;;
    esac
}

gpu() {
    command -v nvidia-smi >/dev/null 2>&1 || { echo "no nvidia-smi"; return 2; }
    nvidia-smi -L | grep -q '^GPU ' || { echo "no GPU listed"; return 2; }
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,compute_mode --format=csv
}

# The package from the carried wheel, without a registry: unpacked beside the binaries.
# Arguments go to the stand-in.
stand_in() {
    local site=$dir/site
    rm -rf "$site"
    mkdir -p "$site"
    python3 -m zipfile -e "$dir"/orbitkv-*.whl "$site" || return 1
    PYTHONPATH="$PWD/$site" python3 adapters/python/device/vllm_pages_check.py \
        --orbitkv "$dir/bin/orbitkv" "$@"
}

# A test executable that needs a GPU: refuses with 2 without one, like the other steps.
gpu_test() {
    gpu >/dev/null || return 2
    "$@"
}

export dir
export -f gpu stand_in gpu_test

# The limits add up to 390 s: the run fits in seven minutes whatever hangs.
step "GPU identity and PCIe link" 20 gpu
step "device check" 45 "$dir/bin/device_check"
step "device check, again" 45 "$dir/bin/device_check"
step "PyTorch engine stand-in through the package" 90 stand_in
step "the stand-in, evicted copies' memory reused" 90 stand_in --dram-bytes 64MiB
step "bridge unit tests" 20 gpu_test "$dir/bin/test-gpu_bridge-orbitkv_gpu_bridge" --test-threads 1
step "daemon: a device pool it cannot open" 20 gpu_test "$dir/bin/test-manager-register_device_pool"
step "daemon: a device pool end to end" 60 gpu_test \
    "$dir/bin/test-manager-device_pool_end_to_end" --include-ignored

if [ "$failed" -ne 0 ]; then
    echo "device run: a step failed (log: $log)"
    exit 1
fi
if [ "$no_device" -ne 0 ]; then
    echo "device run: no GPU here; every step that needs one refused (log: $log)"
    exit 2
fi
echo "device run: every step passed (log: $log)"
