"""The reference routing policy, in Python (componentize-py), on the world
`edgeroute:routing/policy@0.2.0` (`wit/routing-0.2/`): it exports the
interface `router`, so componentize-py looks for a class `Router` here.

The reference decisions and reason strings (`edgeroute policy check
--reference`, components/policies/cases.jsonl), as the Rust, JavaScript and
C ports make them:

Sensitive requests stay local; otherwise the prompt length decides: short
prompts run on the local model, long ones go to the cloud. Availability comes
last: a request goes wherever its preferred target exists.

Parameters (`[policy.params]` in the node config), all optional:
 - local_model (default "smollm2")
 - cloud_upstream (default "frontier")
 - local_max_prompt_tokens (default 512): the longest prompt kept local.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    Decision,
    Features,
    Needs,
    Outcome,
    Plan_Run,
    Target_Cloud,
    Target_Local,
)

U32_MAX = 0xFFFF_FFFF

# Unicode White_Space: what Rust's str::trim removes.
WHITE_SPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


class Config:
    def __init__(self):
        self.local_model = "smollm2"
        self.cloud_upstream = "frontier"
        self.local_max_prompt_tokens = 512


def rust_debug(s: str) -> str:
    """A string quoted the way Rust's `{:?}` quotes it (for error messages).

    Control characters are escaped as Rust does; Rust also escapes other
    non-printable characters (format characters, non-ASCII spaces, combining
    marks), which would need Unicode tables: those pass through here.
    """
    out = ['"']
    for c in s:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c == "\0":
            out.append("\\0")
        elif ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0:
            out.append("\\u{%x}" % ord(c))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def parse_u32(text: str):
    """Rust's `text.trim().parse::<u32>()`: ASCII digits, an optional '+'."""
    t = text.strip(WHITE_SPACE)
    if t.startswith("+"):
        t = t[1:]
    if not t or not all("0" <= c <= "9" for c in t):
        return None
    n = int(t)
    return n if n <= U32_MAX else None


def config_from_params(params):
    config = Config()
    for key, value in params:
        if key == "local_model":
            config.local_model = value
        elif key == "cloud_upstream":
            config.cloud_upstream = value
        elif key == "local_max_prompt_tokens":
            n = parse_u32(value)
            if n is None:
                raise Err(
                    "local_max_prompt_tokens must be a whole number of tokens, got "
                    + rust_debug(value)
                )
            config.local_max_prompt_tokens = n
        # Other policies share the params table: unknown keys are not errors.
    return config


def run(target, reason: str) -> Decision:
    # No propensity: the reference policy does not explore.
    return Decision(Plan_Run(target), reason, None)


def decide(config: Config, f: Features) -> Decision:
    local = Target_Local(config.local_model)
    cloud = Target_Cloud(config.cloud_upstream)

    # The guard would overrule a cloud answer anyway; saying "local" keeps
    # the reason honest, and the host fails closed if local is missing.
    if not f.may_leave:
        return run(local, "sensitive: stays local")

    local_ok = config.local_model in f.local_models
    cloud_ok = config.cloud_upstream in f.cloud_upstreams
    n, t = f.prompt_tokens, config.local_max_prompt_tokens

    if n <= t:
        if not local_ok and cloud_ok:
            return run(cloud, "local model unavailable")
        return run(local, f"short prompt ({n} <= {t} tokens): local")
    if not cloud_ok:
        return run(local, "cloud upstream unavailable: local")
    return run(cloud, f"long prompt ({n} > {t} tokens): cloud")


# `configure` may never run; `route` then uses the defaults.
CONFIG = Config()
# Counters from `observe`: the state a learning policy would keep.
COUNTS = {"observed": 0, "failed": 0, "served_local": 0, "served_cloud": 0}


class Router(exports.Router):
    def configure(self, params) -> Needs:
        global CONFIG
        # Parse everything before storing, so a bad config changes nothing.
        CONFIG = config_from_params(params)
        # No costly signal (the prompt embedding) is needed.
        return Needs(0)

    def route(self, features: Features) -> Decision:
        return decide(CONFIG, features)

    def observe(self, outcome: Outcome) -> None:
        COUNTS["observed"] += 1
        if not outcome.ok:
            COUNTS["failed"] += 1
        if isinstance(outcome.served_by, Target_Local):
            COUNTS["served_local"] += 1
        elif isinstance(outcome.served_by, Target_Cloud):
            COUNTS["served_cloud"] += 1
