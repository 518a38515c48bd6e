#!/usr/bin/env bash
# A policy file for the Spin gateway's component dependency (spin.toml):
#
#   scripts/spin-policy.sh POLICY.wasm OUT.wasm
#
# A policy that imports the node's `host` interface (log, now-ms: every
# `edgeroute policy new` template does) gets it from a component of its
# own, components/policy-host-spin, composed in with `wasm-tools compose`:
# Spin wires a dependency's imports to itself only, and no node is there
# to provide them. The result imports WASI's stderr and wall clock
# instead, which Spin gives every component. Any other policy is copied
# unchanged, byte for byte: still the node's own file.
#
# wasm-tools comes from the policies' toolchains (PyPI, pinned; installed
# when missing); the host component is built into $CARGO_TARGET_DIR's
# wasm-components folder, as host/build.rs builds it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../components/policies/toolchains.sh
source "$ROOT/components/policies/toolchains.sh"
[[ $# -eq 2 ]] || tc_die "usage: $0 POLICY.wasm OUT.wasm"
policy="$1"
out="$2"
[[ -f "$policy" ]] || tc_die "no policy file at $policy"
ensure_python_tools
# Read first: a file wasm-tools cannot read fails here (set -e), rather
# than passing for a policy without `host`.
imports="$(policy_imports "$policy")"
if ! grep -q '^edgeroute:routing/host@' <<<"$imports"; then
    cp "$policy" "$out"
    echo "spin-policy: $policy imports no host interface: copied unchanged to $out"
    exit 0
fi
target="${CARGO_TARGET_DIR:-$ROOT/target}/wasm-components"
cargo build --quiet --release --locked --target wasm32-wasip2 \
    --manifest-path "$ROOT/components/Cargo.toml" -p policy-host-spin --target-dir "$target"
# compose names a definition after its file, which must be kebab-case.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
host="$work/policy-host.wasm"
cp "$target/wasm32-wasip2/release/policy_host_spin.wasm" "$host"
# `wasm-tools compose` warns that it is deprecated for `wac`, which no
# package registry here carries; it still composes by interface name.
"$WASM_TOOLS" compose "$policy" -d "$host" -o "$out" 2>"$work/compose.log" ||
    { cat "$work/compose.log" >&2; exit 1; }
"$WASM_TOOLS" validate "$out"
if policy_imports "$out" | grep -q '^edgeroute:routing/host@'; then
    tc_die "$out still imports edgeroute:routing/host after composing"
fi
echo "spin-policy: $policy with components/policy-host-spin composed in: $out"
echo "spin-policy: it imports: $(policy_imports "$out" | tr '\n' ' ')"
