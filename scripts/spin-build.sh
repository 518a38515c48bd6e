#!/bin/sh
# `spin build` (spin.toml) runs this from the repository root: the gateway
# component and the policy it plugs in, copied to target-wasm/ where
# spin.toml names them.
#
# The policy is built by the same cargo command and into the same target
# folder as the node's own build (host/build.rs), so target-wasm/
# policy_default.wasm is byte for byte the policy the node embeds (its
# /healthz `policy` id is the file's sha256 prefix). The gateway builds
# there too: that folder is not locked while the node's tests run.
#
# The gateway is then pre-initialised (`edgeroute preinit`, wasmtime's
# Wizer): its detector compiled once here instead of in every request's
# fresh instance. $EDGEROUTE names the edgeroute binary; by default the
# release build in the target folder, built first if it is missing.
set -eu
target="${CARGO_TARGET_DIR:-target}"
wasm_dir="$target/wasm-components"
cargo build --release --locked --target wasm32-wasip2 \
    --manifest-path components/Cargo.toml -p policy-default --target-dir "$wasm_dir"
cargo build --release --locked --target wasm32-wasip2 \
    --manifest-path components/spin-gateway/Cargo.toml --target-dir "$wasm_dir"
edgeroute="${EDGEROUTE:-$target/release/edgeroute}"
if [ ! -x "$edgeroute" ]; then
    echo "spin-build: no $edgeroute yet; building it for \`edgeroute preinit\` (cold: about 20 min on 2 cores)"
    cargo build --release --locked -p edgeroute
fi
mkdir -p target-wasm
# What `spin up` runs with (LD_PRELOAD): TCP_NODELAY on Spin's accepted
# connections, without which every streamed answer ends 40 ms late
# (scripts/spin-nodelay.c says why). First, so a failure here leaves
# target-wasm/ as it was.
# shellcheck disable=SC2086 # $CC may carry arguments (ccache cc)
${CC:-cc} -shared -fPIC -O2 -Wall -o target-wasm/spin-nodelay.so scripts/spin-nodelay.c -ldl
cp "$wasm_dir/wasm32-wasip2/release/policy_default.wasm" target-wasm/
"$edgeroute" preinit "$wasm_dir/wasm32-wasip2/release/spin_gateway.wasm" target-wasm/spin_gateway.wasm
