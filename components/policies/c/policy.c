// The reference routing policy, in C (`wit-bindgen c`, clang for wasm32-wasi,
// `wasm-tools component new`), on the world `edgeroute:routing/policy@0.2.0`
// (`wit/routing-0.2/`): the exported interface `router` is the functions
// `exports_edgeroute_routing_router_*`.
//
// The reference decisions and reason strings (`edgeroute policy check
// --reference`, components/policies/cases.jsonl), as the Rust, Python and
// JavaScript ports make them: sensitive requests stay local;
// otherwise the prompt length decides (short prompts run on the local model,
// long ones go to the cloud); availability comes last: a request goes
// wherever its preferred target exists.
//
// Parameters ([policy.params] in the node config), all optional:
//  - local_model (default "smollm2")
//  - cloud_upstream (default "frontier")
//  - local_max_prompt_tokens (default 512): the longest prompt kept local.
//
// Memory, as the canonical ABI has it: the arguments of an export belong to
// the callee (free them), and every string returned is freed by the
// generated post-return function, so it must come from malloc.
//
// Only malloc/free and memcpy/memcmp from wasi-libc are used: nothing that
// reaches a WASI function, so the core module imports nothing and the
// component imports only edgeroute:routing's types (and, as the world has
// it, its host interface, unused here).

#include <stdlib.h>
#include <string.h>

#include "policy.h"

typedef policy_string_t str_t;

// ---------------------------------------------------------------------------
// Strings
// ---------------------------------------------------------------------------

// A growable byte buffer; `data` comes from malloc, as returned strings must.
typedef struct {
  uint8_t *data;
  size_t len, cap;
} buf_t;

static void buf_put(buf_t *b, const void *bytes, size_t n) {
  if (!n) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + n) cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data) abort();
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, bytes, n);
  b->len += n;
}

static void buf_str(buf_t *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_u32(buf_t *b, uint32_t n) {
  char digits[10];
  size_t i = sizeof digits;
  do {
    digits[--i] = (char)('0' + n % 10);
    n /= 10;
  } while (n);
  buf_put(b, digits + i, sizeof digits - i);
}

static str_t buf_take(buf_t *b) {
  str_t s = {b->data, b->len};
  if (!s.len) {
    free(b->data);
    s.ptr = NULL;
  }
  b->data = NULL;
  b->len = b->cap = 0;
  return s;
}

static str_t str_copy(const uint8_t *bytes, size_t len) {
  buf_t b = {0};
  buf_put(&b, bytes, len);
  return buf_take(&b);
}

static str_t str_lit(const char *s) { return str_copy((const uint8_t *)s, strlen(s)); }

static bool str_eq(const str_t *a, const char *lit) {
  size_t n = strlen(lit);
  return a->len == n && memcmp(a->ptr, lit, n) == 0;
}

static bool str_same(const str_t *a, const str_t *b) {
  return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

static bool list_contains(const policy_list_string_t *list, const str_t *s) {
  for (size_t i = 0; i < list->len; i++)
    if (str_same(&list->ptr[i], s)) return true;
  return false;
}

// Length of the Unicode White_Space character (what Rust's str::trim
// removes) that starts at p[0] (or ends at p[-1] when `at_end`), else 0.
static size_t white_space(const uint8_t *start, const uint8_t *end, bool at_end) {
  static const char *const SPACES[] = {
      "\t", "\n", "\v", "\f", "\r", " ",
      "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80",
      "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83",
      "\xe2\x80\x84", "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87",
      "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8",
      "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80",
  };
  size_t avail = (size_t)(end - start);
  for (size_t i = 0; i < sizeof SPACES / sizeof SPACES[0]; i++) {
    size_t n = strlen(SPACES[i]);
    if (n > avail) continue;
    const uint8_t *p = at_end ? end - n : start;
    if (memcmp(p, SPACES[i], n) == 0) return n;
  }
  return 0;
}

// Rust's `text.trim().parse::<u32>()`: ASCII digits with an optional '+'.
static bool parse_u32(const str_t *text, uint32_t *out) {
  const uint8_t *p = text->ptr, *end = text->ptr + text->len;
  size_t n;
  while (p < end && (n = white_space(p, end, false))) p += n;
  while (end > p && (n = white_space(p, end, true))) end -= n;
  if (p < end && *p == '+') p++;
  if (p == end) return false;
  uint64_t value = 0;
  for (; p < end; p++) {
    if (*p < '0' || *p > '9') return false;
    value = value * 10 + (uint64_t)(*p - '0');
    if (value > UINT32_MAX) return false;
  }
  *out = (uint32_t)value;
  return true;
}

// `s` quoted the way Rust's `{:?}` quotes it (for error messages).
// Control characters (C0, DEL, C1) are escaped as Rust does; Rust also
// escapes other non-printable characters (format characters, non-ASCII
// spaces, combining marks), which would need Unicode tables: those pass
// through here.
static void buf_debug(buf_t *b, const str_t *s) {
  static const char HEX[] = "0123456789abcdef";
  buf_str(b, "\"");
  for (size_t i = 0; i < s->len; i++) {
    uint8_t c = s->ptr[i];
    unsigned code = c;
    bool control = c < 0x20 || c == 0x7f;
    if (c == 0xc2 && i + 1 < s->len && s->ptr[i + 1] < 0xa0) {
      code = s->ptr[++i]; // U+0080..U+009F, a C1 control
      control = true;
    }
    switch (code) {
      case '"': buf_str(b, "\\\""); break;
      case '\\': buf_str(b, "\\\\"); break;
      case '\n': buf_str(b, "\\n"); break;
      case '\r': buf_str(b, "\\r"); break;
      case '\t': buf_str(b, "\\t"); break;
      case '\0': buf_str(b, "\\0"); break;
      default:
        if (control) {
          char esc[8] = {'\\', 'u', '{', 0};
          size_t n = 3;
          if (code >= 0x10) esc[n++] = HEX[code >> 4];
          esc[n++] = HEX[code & 15];
          esc[n++] = '}';
          buf_put(b, esc, n);
        } else {
          buf_put(b, &c, 1);
        }
    }
  }
  buf_str(b, "\"");
}

// ---------------------------------------------------------------------------
// The policy
// ---------------------------------------------------------------------------

typedef struct {
  str_t local_model;
  str_t cloud_upstream;
  uint32_t local_max_prompt_tokens;
} config_t;

static config_t config_defaults(void) {
  return (config_t){str_lit("smollm2"), str_lit("frontier"), 512};
}

static void config_free(config_t *c) {
  policy_string_free(&c->local_model);
  policy_string_free(&c->cloud_upstream);
}

// `configure` may never run; `route` then uses the defaults.
static config_t CONFIG;
static bool CONFIGURED;

// Counters from `observe`: the state a learning policy would keep.
static uint64_t OBSERVED, FAILED, SERVED_LOCAL, SERVED_CLOUD;

static config_t *current(void) {
  if (!CONFIGURED) {
    CONFIG = config_defaults();
    CONFIGURED = true;
  }
  return &CONFIG;
}

bool exports_edgeroute_routing_router_configure(policy_list_tuple2_string_string_t *params,
                                                exports_edgeroute_routing_router_needs_t *needs,
                                                str_t *err) {
  // Parse everything before storing, so a bad config changes nothing.
  config_t next = config_defaults();
  bool ok = true;
  for (size_t i = 0; i < params->len && ok; i++) {
    str_t *key = &params->ptr[i].f0, *value = &params->ptr[i].f1;
    if (str_eq(key, "local_model")) {
      policy_string_free(&next.local_model);
      next.local_model = str_copy(value->ptr, value->len);
    } else if (str_eq(key, "cloud_upstream")) {
      policy_string_free(&next.cloud_upstream);
      next.cloud_upstream = str_copy(value->ptr, value->len);
    } else if (str_eq(key, "local_max_prompt_tokens")) {
      if (!parse_u32(value, &next.local_max_prompt_tokens)) {
        buf_t b = {0};
        buf_str(&b, "local_max_prompt_tokens must be a whole number of tokens, got ");
        buf_debug(&b, value);
        *err = buf_take(&b);
        ok = false;
      }
    }
    // Other policies share the params table: unknown keys are not errors.
  }
  policy_list_tuple2_string_string_free(params);
  if (!ok) {
    config_free(&next);
    return false;
  }
  if (CONFIGURED) config_free(&CONFIG);
  CONFIG = next;
  CONFIGURED = true;
  *needs = 0; // no costly signal (the prompt embedding) is needed
  return true;
}

static void decide(const config_t *c, const exports_edgeroute_routing_router_features_t *f,
                   exports_edgeroute_routing_router_decision_t *ret) {
  bool local = true;
  buf_t reason = {0};

  if (!f->may_leave) {
    // The guard would overrule a cloud answer anyway; saying "local" keeps
    // the reason honest, and the host fails closed if local is missing.
    buf_str(&reason, "sensitive: stays local");
  } else {
    bool local_ok = list_contains(&f->local_models, &c->local_model);
    bool cloud_ok = list_contains(&f->cloud_upstreams, &c->cloud_upstream);
    uint32_t n = f->prompt_tokens, t = c->local_max_prompt_tokens;
    if (n <= t) {
      if (!local_ok && cloud_ok) {
        local = false;
        buf_str(&reason, "local model unavailable");
      } else {
        buf_str(&reason, "short prompt (");
        buf_u32(&reason, n);
        buf_str(&reason, " <= ");
        buf_u32(&reason, t);
        buf_str(&reason, " tokens): local");
      }
    } else if (!cloud_ok) {
      buf_str(&reason, "cloud upstream unavailable: local");
    } else {
      local = false;
      buf_str(&reason, "long prompt (");
      buf_u32(&reason, n);
      buf_str(&reason, " > ");
      buf_u32(&reason, t);
      buf_str(&reason, " tokens): cloud");
    }
  }

  const str_t *name = local ? &c->local_model : &c->cloud_upstream;
  ret->plan.tag = EDGEROUTE_ROUTING_TYPES_PLAN_RUN;
  ret->plan.val.run.tag = local ? EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL : EDGEROUTE_ROUTING_TYPES_TARGET_CLOUD;
  // The targets' names share the union's storage.
  ret->plan.val.run.val.local = str_copy(name->ptr, name->len);
  ret->reason = buf_take(&reason);
  // No propensity: the reference policy does not explore.
  ret->propensity.is_some = false;
}

void exports_edgeroute_routing_router_route(exports_edgeroute_routing_router_features_t *features,
                                            exports_edgeroute_routing_router_decision_t *ret) {
  decide(current(), features, ret);
  exports_edgeroute_routing_router_features_free(features);
}

void exports_edgeroute_routing_router_observe(exports_edgeroute_routing_router_outcome_t *outcome) {
  OBSERVED++;
  if (!outcome->ok) FAILED++;
  if (outcome->served_by.is_some) {
    if (outcome->served_by.val.tag == EDGEROUTE_ROUTING_TYPES_TARGET_LOCAL) SERVED_LOCAL++;
    else if (outcome->served_by.val.tag == EDGEROUTE_ROUTING_TYPES_TARGET_CLOUD) SERVED_CLOUD++;
  }
  exports_edgeroute_routing_router_outcome_free(outcome);
}
