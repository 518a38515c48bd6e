#!/usr/bin/env bash
# Coverage-guided fuzzing of fuzz/fuzz_targets/* with libFuzzer, built by
# stable rustc (its sancov flags; no nightly toolchain, no cargo-fuzz).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default: 60 s, all)
# A failure leaves its input in fuzz/artifacts/TARGET/ and exits non-zero;
# the corpus grows in $CARGO_TARGET_DIR/fuzz-corpus/TARGET (seeded from
# fuzz/seeds/TARGET when that exists).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-60}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(strict_json request sensitivity detect sse)
fi
target_dir="${CARGO_TARGET_DIR:-target}/fuzz"
corpus_root="${CARGO_TARGET_DIR:-target}/fuzz-corpus"
host="$(rustc -vV | sed -n 's/^host: //p')"
# cargo-fuzz's instrumentation flags; --target keeps them off build scripts.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions"
cargo build --release --locked --manifest-path fuzz/Cargo.toml --target "$host" \
    --target-dir "$target_dir" "${targets[@]/#/--bin=}"
for t in "${targets[@]}"; do
    corpus="$corpus_root/$t"
    mkdir -p "$corpus" "fuzz/artifacts/$t"
    seeds=()
    [[ -d "fuzz/seeds/$t" ]] && seeds=("fuzz/seeds/$t")
    echo "==> fuzz $t for ${secs} s"
    "$target_dir/$host/release/$t" "$corpus" "${seeds[@]}" \
        -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 2>&1 |
        grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss|SUMMARY|panicked|ERROR|Test unit written" || true
    if compgen -G "fuzz/artifacts/$t/*" >/dev/null; then
        echo "fuzz $t: failing input(s) in fuzz/artifacts/$t/" >&2
        exit 1
    fi
done
