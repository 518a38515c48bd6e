#!/usr/bin/env bash
# Decode speed of the portable release build (x86-64-v3, .cargo/config.toml)
# against a build for this machine's own CPU (target-cpu=native), both
# measured by `edgeroute bench` in one run of this script, alternating.
#
#   scripts/bench-portable.sh [--runs N] [--tokens N] [--rounds N]
#
# The native build goes into its own target folder
# (~/.cache/edgeroute-target-native) and takes as long as a cold build the
# first time (llama.cpp and wasmtime for another CPU baseline).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
runs=3 tokens=64 rounds=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --tokens) tokens="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        *) echo "bench-portable: unknown argument $1" >&2; exit 2 ;;
    esac
done
portable_dir="${CARGO_TARGET_DIR:-$HOME/.cache/edgeroute-target}"
native_dir="$HOME/.cache/edgeroute-target-native"

echo "==> building the portable binary (x86-64-v3) in $portable_dir"
CARGO_TARGET_DIR="$portable_dir" cargo build --release -j2 -p edgeroute --bin edgeroute
echo "==> building the native binary (target-cpu=native) in $native_dir"
# CARGO_TARGET_<triple>_RUSTFLAGS wins over .cargo/config.toml's
# target.<triple>.rustflags for the host only; the wasm guests keep theirs.
CARGO_TARGET_DIR="$native_dir" \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-cpu=native" \
    cargo build --release -j2 -p edgeroute --bin edgeroute

decode_rate() { # BINARY → median decode tokens/s through wasi-nn
    "$1" bench --runs "$runs" --tokens "$tokens" --policy-calls 1000 2>/dev/null |
        awk '/decode tokens\/s/ { print $(NF-1) }'
}

portable=() native=()
for ((round = 0; round < rounds; round++)); do
    if ((round % 2 == 0)); then
        portable+=("$(decode_rate "$portable_dir/release/edgeroute")")
        native+=("$(decode_rate "$native_dir/release/edgeroute")")
    else
        native+=("$(decode_rate "$native_dir/release/edgeroute")")
        portable+=("$(decode_rate "$portable_dir/release/edgeroute")")
    fi
done
python3 - "${portable[*]}" "${native[*]}" <<'PY'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
n = [float(x) for x in sys.argv[2].split()]
mp, mn = statistics.median(p), statistics.median(n)
print(f"decode tokens/s through wasi-nn, median of {len(p)} bench runs each:")
print(f"  portable (x86-64-v3) {mp:.1f}   native {mn:.1f}   ratio portable/native {mp / mn:.3f}")
PY
