#!/usr/bin/env bash
# Build the reference routing policy in Python, JavaScript and C:
#
#   components/policies/build-all.sh OUT_DIR
#
# writes OUT_DIR/policy_python.wasm, policy_js.wasm and policy_c.wasm, and
# prints each one's size, build time and imports. Installs what is missing
# first (see toolchains.sh: pip, npm and cargo into
# ~/.cache/edgeroute-toolchains, apt for clang/lld/wasi-libc); quiet when
# everything is there. The Rust reference policy (components/policy-default)
# is built by the host's build (host/build.rs).
#
# Every component is checked against the routing policy's allowed imports
# (wasi:cli, clocks, random, io, edgeroute:routing/types and /host: the node's ALLOWED);
# the build fails if one imports more.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/toolchains.sh"
[[ $# -eq 1 ]] || tc_die "usage: $0 OUT_DIR"
mkdir -p "$1"
out_dir="$(cd "$1" && pwd)"

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

step() { printf '\n==> %s\n' "$*" >&2; }

step "toolchains (under $TOOLCHAINS)"
t0="$(now)"
ensure_python_tools
tc_note "ok: $("$COMPONENTIZE_PY" --version), $("$WASM_TOOLS" --version | cut -d' ' -f1-2)"
ensure_js_tools
tc_note "ok: jco $("$JCO" --version), node $(node --version)"
ensure_c_tools
tc_note "ok: $("$CLANG" --version | head -1), wit-bindgen-c $(grep -m1 -A1 'name = "wit-bindgen-c"' "$HERE/c/wit-bindgen-c/Cargo.lock" | sed -n 's/version = "\(.*\)"/\1/p')"
tc_note "toolchains ready in $(secs "$t0" "$(now)") s"

summary=()
for lang in python js c; do
    file="$out_dir/policy_$lang.wasm"
    step "$lang: $HERE/$lang/build.sh $file"
    rm -f "$file"
    t0="$(now)"
    bash "$HERE/$lang/build.sh" "$file"
    took="$(secs "$t0" "$(now)")"
    size="$(stat -c %s "$file")"
    imports="$(policy_imports "$file" | tr '\n' ' ')"
    tc_note "built $(basename "$file"): $size bytes in $took s"
    tc_note "imports: ${imports:-nothing}"
    summary+=("$(printf '%-20s %10s bytes %6s s   imports: %s' "policy_$lang.wasm" "$size" "$took" "${imports:-nothing}")")
done

step "built into $out_dir"
printf '    %s\n' "${summary[@]}" >&2
