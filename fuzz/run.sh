#!/usr/bin/env bash
# A long fuzzing campaign on stable Rust: fuzz/run.sh TARGET SECONDS [extra libFuzzer flags...]
# New inputs go to fuzz/corpus/TARGET (not committed); the committed seeds are read too.
set -euo pipefail
cd "$(dirname "$0")"
if [ $# -lt 2 ]; then
    echo "usage: fuzz/run.sh TARGET SECONDS [libFuzzer flags]   (targets: $(cargo fuzz list | tr '\n' ' '))" >&2
    exit 2
fi
target=$1
seconds=$2
shift 2
mkdir -p "corpus/$target"
exec cargo fuzz run -s none "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 "$@"
