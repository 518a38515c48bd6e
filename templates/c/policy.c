// A routing policy in C for edgeroute (world `edgeroute:routing/policy@0.2.0`).
//
// Short prompts run on the first local model, long ones on the first cloud
// upstream; a request that may not leave stays local, or is rejected when
// no local model is loaded. It logs through the node (`host.log`) and reads
// the node's clock (`host.now-ms`): no WASI needed.
//
// Memory rules of the generated bindings (policy.h):
// - everything the host passes in (`features`, `params`, `outcome`) is
//   owned by this function: free it with the matching `..._free`;
// - every string handed back (`reason`, target names, `err`) must be
//   malloc'ed: `policy_string_dup` copies a C string into malloc'ed memory
//   (use it), `policy_string_set` only points at it (for the host's own
//   strings; never for a literal you return).

#include <stdlib.h>
#include <string.h>

#include "policy.h"

// Prompts up to this many tokens run locally (`[policy.params]
// local_max_prompt_tokens`).
static uint32_t local_max_prompt_tokens = 512;

// `text` + the decimal digits of `n` into `out` (no stdio: wasi-libc's
// printf family writes through WASI files, which a policy may not import).
static void with_number(char *out, size_t size, const char *text, uint64_t n) {
    char digits[21];
    size_t len = 0;
    do {
        digits[len++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    size_t at = strlen(text) < size - 1 ? strlen(text) : size - 1;
    memcpy(out, text, at);
    while (len > 0 && at < size - 1) {
        out[at++] = digits[--len];
    }
    out[at] = '\0';
}

static void log_line(edgeroute_routing_host_log_level_t level, const char *text) {
    policy_string_t message;
    policy_string_set(&message, text); // borrowed: the host copies it
    edgeroute_routing_host_log(level, &message);
}

static bool starts_with(const policy_string_t *s, const char *prefix) {
    size_t n = strlen(prefix);
    return s->len >= n && memcmp(s->ptr, prefix, n) == 0;
}

bool exports_edgeroute_routing_router_configure(policy_list_tuple2_string_string_t *params,
                                                exports_edgeroute_routing_router_needs_t *ret,
                                                policy_string_t *err) {
    bool ok = true;
    for (size_t i = 0; i < params->len; i++) {
        policy_string_t *key = &params->ptr[i].f0, *value = &params->ptr[i].f1;
        if (key->len == strlen("local_max_prompt_tokens") &&
            starts_with(key, "local_max_prompt_tokens")) {
            char digits[16] = {0};
            size_t n = value->len < sizeof digits - 1 ? value->len : sizeof digits - 1;
            memcpy(digits, value->ptr, n);
            char *end = NULL;
            long v = strtol(digits, &end, 10);
            if (n == 0 || *end != '\0' || v < 0) {
                policy_string_dup(err, "local_max_prompt_tokens must be a whole number of tokens");
                ok = false;
                break;
            }
            local_max_prompt_tokens = (uint32_t)v;
        }
    }
    policy_list_tuple2_string_string_free(params);
    if (ok) {
        char line[96];
        with_number(line, sizeof line, "configured: local_max_prompt_tokens=", local_max_prompt_tokens);
        log_line(EDGEROUTE_ROUTING_HOST_LOG_LEVEL_INFO, line);
        *ret = 0; // no costly signal (the embedding) is needed
    }
    return ok;
}

// Run on `name` (copied: the features are freed before the host reads it).
static void run(exports_edgeroute_routing_router_decision_t *ret, uint8_t kind,
                const policy_string_t *name, const char *reason) {
    ret->plan.tag = EDGEROUTE_ROUTING_TYPES_PLAN_RUN;
    ret->plan.val.run.tag = kind;
    policy_string_t *slot = kind == EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL ? &ret->plan.val.run.val.local
                                                                         : &ret->plan.val.run.val.cloud;
    policy_string_dup_n(slot, (const char *)name->ptr, name->len);
    policy_string_dup(&ret->reason, reason);
    ret->propensity.is_some = false;
}

void exports_edgeroute_routing_router_route(exports_edgeroute_routing_router_features_t *f,
                                            exports_edgeroute_routing_router_decision_t *ret) {
    bool has_local = f->local_models.len > 0, has_cloud = f->cloud_upstreams.len > 0;
    bool is_short = f->prompt_tokens <= local_max_prompt_tokens;
    if (!f->may_leave && !has_local) {
        // Naming a local model that is not loaded would also fail closed;
        // `reject` says why.
        ret->plan.tag = EDGEROUTE_ROUTING_TYPES_PLAN_REJECT;
        policy_string_dup(&ret->plan.val.reject, "this request may not leave and no local model is loaded");
        policy_string_dup(&ret->reason, "sensitive, no local model: reject");
        ret->propensity.is_some = false;
    } else if (!f->may_leave) {
        run(ret, EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL, &f->local_models.ptr[0], "sensitive: stays local");
    } else if (has_local && (is_short || !has_cloud)) {
        run(ret, EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL, &f->local_models.ptr[0], "short prompt: local");
    } else if (has_cloud) {
        run(ret, EDGEROUTE_ROUTING_TYPES_TARGET_CLOUD, &f->cloud_upstreams.ptr[0], "long prompt: cloud");
    } else {
        ret->plan.tag = EDGEROUTE_ROUTING_TYPES_PLAN_REJECT;
        policy_string_dup(&ret->plan.val.reject, "no target is configured");
        policy_string_dup(&ret->reason, "no target: reject");
        ret->propensity.is_some = false;
    }
    char line[96];
    with_number(line, sizeof line, "routed a prompt at (ms since the epoch) ", edgeroute_routing_host_now_ms());
    log_line(EDGEROUTE_ROUTING_HOST_LOG_LEVEL_DEBUG, line);
    exports_edgeroute_routing_router_features_free(f);
}

void exports_edgeroute_routing_router_observe(exports_edgeroute_routing_router_outcome_t *outcome) {
    if (!outcome->ok) {
        log_line(EDGEROUTE_ROUTING_HOST_LOG_LEVEL_WARN, "a request this policy placed failed");
    }
    exports_edgeroute_routing_router_outcome_free(outcome);
}
