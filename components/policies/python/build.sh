#!/usr/bin/env bash
# Build the Python routing policy: build.sh OUT.wasm
#
#   componentize-py -d wit/routing-0.2 -w policy componentize --stub-wasi app -o OUT.wasm
#
# --stub-wasi replaces every WASI import of the Python runtime with a
# trapping stub, so the component imports only edgeroute:routing/types and
# /host (the world's, whether or not it calls them):
# without it, it imports wasi:filesystem and wasi:sockets, and the node
# refuses it. The cost: print() and anything else that reaches WASI traps
# (a trap in `route` makes the node use its safe default).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../toolchains.sh
source "$HERE/../toolchains.sh"
[[ $# -eq 1 ]] || tc_die "usage: $0 OUT.wasm"
out="$1"
mkdir -p "$(dirname "$out")"
ensure_python_tools
# componentize-py runs app.py at build time (pre-initialization) and leaves
# a __pycache__ beside it: build from a copy.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$HERE/app.py" "$work/"
"$COMPONENTIZE_PY" --quiet -d "$HERE/../../../wit/routing-0.2" -w policy \
    componentize --stub-wasi -p "$work" app -o "$out"
check_policy_imports "$out"
