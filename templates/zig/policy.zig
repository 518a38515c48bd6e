//! A routing policy in Zig for edgeroute (world `edgeroute:routing/policy@0.2.0`).
//!
//! Short prompts run on the first local model, long ones on the first cloud
//! upstream; a request that may not leave stays local, or is rejected when
//! no local model is loaded. It logs through the node (`host.log`) and reads
//! the node's clock (`host.now-ms`): no WASI needed.
//!
//! Zig reaches the contract through the C bindings a wit-bindgen C
//! generator writes (policy.h, policy.c; see build.sh): this file defines
//! the three `exports_edgeroute_routing_router_*` functions policy.h
//! declares, with the C ABI (`export fn`), and calls the generated helpers.
//!
//! Memory rules of the generated bindings (policy.h):
//! - everything the host passes in (`features`, `params`, `outcome`) is
//!   owned by this function: free it with the matching `..._free`;
//! - every string handed back (`reason`, target names, `err`) must be
//!   malloc'ed: `policy_string_dup` copies a C string into malloc'ed memory
//!   (use it), `policy_string_set` only points at it (for a string the host
//!   only reads during the call, like a log message; never for a string you
//!   return).
//!
//! No `std.debug.print`, `std.log`, `std.fs`, `std.Io` files or the
//! default panic handler: they write through WASI files, which a policy may
//! not import (the node refuses it). Log through `log` below.

const std = @import("std");

const c = @cImport({
    @cInclude("policy.h");
});

// A panic traps (the node then serves its safe default) instead of printing
// through WASI's stderr, which the default handler would import.
pub const panic = std.debug.no_panic;

/// Prompts up to this many tokens run locally (`[policy.params]
/// local_max_prompt_tokens`).
var local_max_prompt_tokens: u32 = 512;

/// The bytes of a string the host passed in.
fn bytes(s: c.policy_string_t) []const u8 {
    return if (s.len == 0) "" else s.ptr[0..s.len];
}

/// One line in the node's log. `text` is borrowed: the host copies it.
fn log(level: c.edgeroute_routing_host_log_level_t, text: [:0]const u8) void {
    var message: c.policy_string_t = undefined;
    c.policy_string_set(&message, text.ptr);
    c.edgeroute_routing_host_log(level, &message);
}

/// `text` followed by the decimal digits of `n`, into `buf` (cut to fit).
fn withNumber(buf: []u8, text: []const u8, n: u64) [:0]const u8 {
    return std.fmt.bufPrintZ(buf, "{s}{d}", .{ text, n }) catch "";
}

/// A whole number of tokens: digits only, at most `maxInt(u32)`.
fn parseTokens(text: []const u8) ?u32 {
    if (text.len == 0) return null;
    var v: u32 = 0;
    for (text) |ch| {
        if (ch < '0' or ch > '9') return null;
        v = std.math.mul(u32, v, 10) catch return null;
        v = std.math.add(u32, v, ch - '0') catch return null;
    }
    return v;
}

export fn exports_edgeroute_routing_router_configure(
    params: *c.policy_list_tuple2_string_string_t,
    ret: *c.exports_edgeroute_routing_router_needs_t,
    err: *c.policy_string_t,
) bool {
    defer c.policy_list_tuple2_string_string_free(params);
    var i: usize = 0;
    while (i < params.len) : (i += 1) {
        const kv = &params.ptr[i];
        if (std.mem.eql(u8, bytes(kv.f0), "local_max_prompt_tokens")) {
            local_max_prompt_tokens = parseTokens(bytes(kv.f1)) orelse {
                c.policy_string_dup(err, "local_max_prompt_tokens must be a whole number of tokens");
                return false;
            };
        }
    }
    var line: [96]u8 = undefined;
    log(c.EDGEROUTE_ROUTING_HOST_LOG_LEVEL_INFO, withNumber(&line, "configured: local_max_prompt_tokens=", local_max_prompt_tokens));
    ret.* = 0; // no costly signal (the embedding) is needed
    return true;
}

/// Run on `name` (copied: the features are freed before the host reads it).
fn run(ret: *c.exports_edgeroute_routing_router_decision_t, kind: u8, name: c.policy_string_t, reason: [:0]const u8) void {
    ret.plan.tag = c.EDGEROUTE_ROUTING_TYPES_PLAN_RUN;
    ret.plan.val.run.tag = kind;
    const slot = if (kind == c.EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL) &ret.plan.val.run.val.local else &ret.plan.val.run.val.cloud;
    c.policy_string_dup_n(slot, name.ptr, name.len);
    c.policy_string_dup(&ret.reason, reason.ptr);
    ret.propensity.is_some = false;
}

fn reject(ret: *c.exports_edgeroute_routing_router_decision_t, message: [:0]const u8, reason: [:0]const u8) void {
    ret.plan.tag = c.EDGEROUTE_ROUTING_TYPES_PLAN_REJECT;
    c.policy_string_dup(&ret.plan.val.reject, message.ptr);
    c.policy_string_dup(&ret.reason, reason.ptr);
    ret.propensity.is_some = false;
}

export fn exports_edgeroute_routing_router_route(
    f: *c.exports_edgeroute_routing_router_features_t,
    ret: *c.exports_edgeroute_routing_router_decision_t,
) void {
    defer c.exports_edgeroute_routing_router_features_free(f);
    const has_local = f.local_models.len > 0;
    const has_cloud = f.cloud_upstreams.len > 0;
    const is_short = f.prompt_tokens <= local_max_prompt_tokens;
    if (!f.may_leave and !has_local) {
        // Naming a local model that is not loaded would also fail closed;
        // `reject` says why.
        reject(ret, "this request may not leave and no local model is loaded", "sensitive, no local model: reject");
    } else if (!f.may_leave) {
        run(ret, c.EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL, f.local_models.ptr[0], "sensitive: stays local");
    } else if (has_local and (is_short or !has_cloud)) {
        run(ret, c.EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL, f.local_models.ptr[0], "short prompt: local");
    } else if (has_cloud) {
        run(ret, c.EDGEROUTE_ROUTING_TYPES_TARGET_CLOUD, f.cloud_upstreams.ptr[0], "long prompt: cloud");
    } else {
        reject(ret, "no target is configured", "no target: reject");
    }
    var line: [96]u8 = undefined;
    log(c.EDGEROUTE_ROUTING_HOST_LOG_LEVEL_DEBUG, withNumber(&line, "routed a prompt at (ms since the epoch) ", c.edgeroute_routing_host_now_ms()));
}

export fn exports_edgeroute_routing_router_observe(outcome: *c.exports_edgeroute_routing_router_outcome_t) void {
    defer c.exports_edgeroute_routing_router_outcome_free(outcome);
    if (!outcome.ok) {
        log(c.EDGEROUTE_ROUTING_HOST_LOG_LEVEL_WARN, "a request this policy placed failed");
    }
}
