#!/usr/bin/env bash
# Build this policy into policy.wasm:
#
#   bash build.sh [OUT.wasm]
#
# Needs Node.js 20 or later with npm. jco and componentize-js (StarlingMonkey,
# a SpiderMonkey build for WASI) come from npm at the exact versions in
# package.json and package-lock.json: the first build installs them into
# node_modules/ (`npm ci`, about 340 MB), later builds reuse them. Set JCO
# to a jco program (same version) to use that one and install nothing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$HERE/policy.wasm}"
if [[ -z "${JCO:-}" ]]; then
    command -v npm >/dev/null 2>&1 || {
        echo "build.sh: npm not found; install Node.js 20 or later (with npm)" >&2
        exit 1
    }
    JCO="$HERE/node_modules/.bin/jco"
    # Installs again when package.json or package-lock.json changed.
    pins() { cat "$HERE/package.json" "$HERE/package-lock.json" 2>/dev/null | cksum || true; }
    stamp="$HERE/node_modules/.edgeroute-installed"
    if [[ ! -x "$JCO" || "$(cat "$stamp" 2>/dev/null)" != "$(pins)" ]]; then
        echo "installing jco and componentize-js into $HERE/node_modules (npm)" >&2
        if [[ -f "$HERE/package-lock.json" ]]; then
            (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error >&2)
        else
            (cd "$HERE" && npm install --no-audit --no-fund --loglevel=error >&2)
        fi
        pins >"$stamp"
    fi
fi
# componentize-js reports a syntax error without saying where; node does.
node --check "$HERE/policy.js"
# --disable all: leaves out the WASI features StarlingMonkey would
#   otherwise import (clocks, random, stdio, http, fetch-event). The
#   component then imports only this package's `host` and `types`
#   interfaces; an HTTP or filesystem import would make the node refuse it. `host.nowMs()` is the
#   clock; a policy that needs randomness can add `--enable random`.
"$JCO" componentize "$HERE/policy.js" --wit "$HERE/wit" --world-name policy \
    --disable all -o "$out" >/dev/null
echo "built $out ($(stat -c %s "$out") bytes)"
