"""A routing policy in Python for edgeroute (world
`edgeroute:routing/policy@0.2.0`, in `wit/`).

Short prompts run on the first local model, long ones on the first cloud
upstream; a request that may not leave stays local, or is rejected when no
local model is loaded. It logs through the node (`host.log`) and reads the
node's clock (`host.now_ms`): no WASI needed.

The world exports the interface `router`, so componentize-py looks for a
class named `Router` in this module (`wit_world.exports.Router` is its
protocol). Avoid `print()` and anything else that reaches WASI (files,
sockets, the environment): the build stubs WASI out, and such a call traps
(a trap in `route` gets the node's safe default). Log with `host.log`.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.host import LogLevel
from wit_world.imports.types import (
    Decision,
    Features,
    Needs,
    Outcome,
    Plan_Reject,
    Plan_Run,
    Target_Cloud,
    Target_Local,
)

U32_MAX = 0xFFFF_FFFF

# Prompts up to this many tokens run locally (`[policy.params]
# local_max_prompt_tokens`).
local_max_prompt_tokens = 512


def parse_tokens(text: str):
    """A whole number of tokens (ASCII digits, an optional '+'), or None."""
    t = text.strip()
    if t.startswith("+"):
        t = t[1:]
    if not t or not all("0" <= c <= "9" for c in t):
        return None
    n = int(t)
    return n if n <= U32_MAX else None


def run(target, reason: str) -> Decision:
    return Decision(Plan_Run(target), reason, None)


def reject(why: str, reason: str) -> Decision:
    return Decision(Plan_Reject(why), reason, None)


def decide(f: Features) -> Decision:
    has_local, has_cloud = bool(f.local_models), bool(f.cloud_upstreams)
    is_short = f.prompt_tokens <= local_max_prompt_tokens
    if not f.may_leave and not has_local:
        # Naming a local model that is not loaded would also fail closed;
        # `reject` says why.
        return reject(
            "this request may not leave and no local model is loaded",
            "sensitive, no local model: reject",
        )
    if not f.may_leave:
        return run(Target_Local(f.local_models[0]), "sensitive: stays local")
    if has_local and (is_short or not has_cloud):
        return run(Target_Local(f.local_models[0]), "short prompt: local")
    if has_cloud:
        return run(Target_Cloud(f.cloud_upstreams[0]), "long prompt: cloud")
    return reject("no target is configured", "no target: reject")


class Router(exports.Router):
    def configure(self, params) -> Needs:
        global local_max_prompt_tokens
        tokens = local_max_prompt_tokens
        for key, value in params:
            if key == "local_max_prompt_tokens":
                tokens = parse_tokens(value)
                if tokens is None:
                    # An error refuses the policy (at load or swap time).
                    raise Err("local_max_prompt_tokens must be a whole number of tokens")
        local_max_prompt_tokens = tokens
        host.log(LogLevel.INFO, f"configured: local_max_prompt_tokens={local_max_prompt_tokens}")
        # No costly signal (the prompt embedding) is needed.
        return Needs(0)

    def route(self, features: Features) -> Decision:
        decision = decide(features)
        host.log(LogLevel.DEBUG, f"routed a prompt at (ms since the epoch) {host.now_ms()}")
        return decision

    def observe(self, outcome: Outcome) -> None:
        if not outcome.ok:
            host.log(LogLevel.WARN, "a request this policy placed failed")
