#!/usr/bin/env bash
# Build the JavaScript routing policy: build.sh OUT.wasm
#
#   jco componentize policy.js --wit wit --world-name policy --disable all -o OUT.wasm
#
# jco and componentize-js (StarlingMonkey, a SpiderMonkey build for WASI)
# come from package-lock.json; `npm ci` installs them once under
# ~/.cache/edgeroute-toolchains/js. `--disable all` leaves out the WASI
# features StarlingMonkey would otherwise import (clocks, random, stdio,
# http, fetch-event): the component imports only edgeroute:routing/types.
# A policy that needs a clock or randomness can enable just that feature
# (`--enable clocks`): both are allowed imports for a policy.
#
# EDGEROUTE_JS_BACKEND=qjs builds on jco's QuickJS backend
# (componentize-qjs, WASI stubbed out) instead: about 1.7 MB instead of 12.5,
# ~2 s to compile in the node instead of ~18, and `route` in ~18 µs instead
# of ~600 µs. The default stays StarlingMonkey (componentize-js).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../toolchains.sh
source "$HERE/../toolchains.sh"
[[ $# -eq 1 ]] || tc_die "usage: $0 OUT.wasm"
out="$1"
mkdir -p "$(dirname "$out")"
ensure_js_tools
case "${EDGEROUTE_JS_BACKEND:-starlingmonkey}" in
    starlingmonkey) backend=(--disable all) ;;
    qjs) backend=(--backend qjs --backend-qjs-stub-wasi --backend-qjs-disable-async) ;;
    *) tc_die "EDGEROUTE_JS_BACKEND must be starlingmonkey or qjs" ;;
esac
"$JCO" componentize "$HERE/policy.js" --wit "$HERE/../../../wit/routing-0.2" --world-name policy \
    "${backend[@]}" -o "$out" >/dev/null
ensure_python_tools # wasm-tools, for the imports check
check_policy_imports "$out"
