#!/usr/bin/env bash
# Build the C routing policy: build.sh OUT.wasm
#
#   wit-bindgen c --world policy wit                  → policy.h policy.c policy_component_type.o
#   clang --target=wasm32-wasi -mexec-model=reactor   → a core module
#   wasm-tools component new                          → the component
#
# The bindings are generated at build time (never committed), by a small
# program over the wit-bindgen-c crate (wit-bindgen-c/, built once with
# cargo: `cargo install wit-bindgen-cli` takes 20-30 minutes on 2 cores).
#
# policy.c uses only malloc/free and memcpy/memcmp from wasi-libc, which
# reach no WASI function: the core module imports nothing, so `component
# new` needs no preview1 adapter (the reactor adapter would bring in
# wasi:filesystem, which a policy may not import), and the component
# imports only edgeroute:routing/types. Calling printf, time() or getenv()
# would add wasi_snapshot_preview1 imports and `component new` would fail.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../toolchains.sh
source "$HERE/../toolchains.sh"
[[ $# -eq 1 ]] || tc_die "usage: $0 OUT.wasm"
out="$1"
mkdir -p "$(dirname "$out")"
ensure_c_tools
ensure_python_tools # wasm-tools
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$WIT_BINDGEN_C" "$HERE/../../../wit/routing-0.2" policy "$work" >/dev/null
"$CLANG" --target=wasm32-wasi -mexec-model=reactor -Os -Wall -Wextra -Werror \
    -I "$work" -o "$work/policy.core.wasm" \
    "$HERE/policy.c" "$work/policy.c" "$work/policy_component_type.o" \
    -Wl,--strip-debug
"$WASM_TOOLS" component new "$work/policy.core.wasm" -o "$out"
check_policy_imports "$out"
