#!/usr/bin/env bash
# A fleet of three edgeroute nodes and a Redis on this machine:
#
#   bash scripts/fleet.sh            # nodes on 127.0.0.1:8081, :8082, :8083
#
# Each node runs the embedded default config (runtime-config/edgeroute.toml)
# plus a [fleet] section: its name (edge-1..3), the zone "site-a", the
# shared Redis (Debian's redis-server, started here on port
# ${REDIS_PORT:-6390} with no persistence) and a shared token. A busy node
# forwards what may leave it to the least loaded of two random peers; see
# README "A fleet of nodes". Ctrl-C stops everything.
#
#   TEST_BACKEND=1 bash scripts/fleet.sh   # the paced TEST backend instead of
#                                          # llama.cpp ([local.test_backend]):
#                                          # placement without three models
#                                          # fighting over the cores
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$HOME/.cache/edgeroute-target}"
BIN="$TARGET/release/edgeroute"
REDIS_PORT="${REDIS_PORT:-6390}"
DIR="$TARGET/fleet"
export EDGEROUTE_FLEET_TOKEN="${EDGEROUTE_FLEET_TOKEN:-$(head -c 24 /dev/urandom | base64)}"

command -v redis-server >/dev/null || { echo "redis-server is missing: ./dev setup installs it" >&2; exit 1; }
[[ -x "$BIN" ]] || (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" cargo build --release -p edgeroute)

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT INT TERM
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
pids+=($!)
for n in 1 2 3; do
    mkdir -p "$DIR/edge-$n"
    config="$DIR/edge-$n/edgeroute.toml"
    # Model paths made absolute: the copy lives in another folder.
    sed "s|\"\.\./models/|\"$ROOT/models/|" "$ROOT/runtime-config/edgeroute.toml" >"$config"
    cat >>"$config" <<TOML

[node]
state_dir = "$DIR/edge-$n/state"

[fleet]
node = "edge-$n"
zone = "site-a"
redis = "redis://127.0.0.1:$REDIS_PORT"
TOML
    if [[ -n "${TEST_BACKEND:-}" ]]; then
        # The speeds `edgeroute bench` measured for one stream on one thread.
        printf '\n[local.test_backend]\nprefill_tokens_per_s = 120.0\ndecode_tokens_per_s = 60.0\n' >>"$config"
    fi
    "$BIN" up --config "$config" --listen "127.0.0.1:808$n" 2> >(sed "s/^/[edge-$n] /" >&2) &
    pids+=($!)
done
echo "fleet: http://127.0.0.1:8081 http://127.0.0.1:8082 http://127.0.0.1:8083 (GET /healthz shows each node's view of its peers)"
wait
