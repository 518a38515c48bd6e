#!/usr/bin/env bash
# Build this policy into policy.wasm:
#
#   bash build.sh [OUT.wasm]
#
# Needs Rust with the wasm32-wasip2 target (`rustup target add wasm32-wasip2`);
# wit-bindgen comes from crates.io through Cargo.toml.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$HERE/policy.wasm}"
cd "$HERE"
# wasm32-wasip2 links a component directly (no wasm-tools step).
cargo build --release --target wasm32-wasip2 --quiet
cp "${CARGO_TARGET_DIR:-$HERE/target}/wasm32-wasip2/release/{{crate}}.wasm" "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
