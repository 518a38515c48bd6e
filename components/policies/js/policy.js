// The reference routing policy, in JavaScript (jco componentize /
// componentize-js), on the world `edgeroute:routing/policy@0.2.0`
// (`wit/routing-0.2/`): the exported interface `router` is this module's
// export `router`, an object with its functions.
//
// The reference decisions and reason strings (`edgeroute policy check
// --reference`, components/policies/cases.jsonl), as the Rust, Python and
// C ports make them: sensitive requests stay local;
// otherwise the prompt length decides (short prompts run on the local model,
// long ones go to the cloud); availability comes last: a request goes
// wherever its preferred target exists.
//
// Parameters ([policy.params] in the node config), all optional:
//  - local_model (default "smollm2")
//  - cloud_upstream (default "frontier")
//  - local_max_prompt_tokens (default 512): the longest prompt kept local.
//
// WIT to JS: records are objects with camelCase fields, a variant is
// { tag, val }, an enum is its case name as a string, option<T> is
// T | undefined, flags are an object of booleans, and throwing from a
// function that returns result<T, E> answers err (the thrown object's
// `payload`).

const U32_MAX = 0xffffffff;

// Unicode White_Space: what Rust's str::trim removes.
const WHITE_SPACE =
  '\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680' +
  '\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a' +
  '\u2028\u2029\u202f\u205f\u3000';

function defaults() {
  return {
    localModel: 'smollm2',
    cloudUpstream: 'frontier',
    localMaxPromptTokens: 512,
  };
}

// A string quoted the way Rust's `{:?}` quotes it (for error messages).
// Control characters are escaped as Rust does; Rust also escapes other
// non-printable characters (format characters, non-ASCII spaces, combining
// marks), which would need Unicode tables: those pass through here.
function rustDebug(s) {
  let out = '"';
  for (const c of s) {
    const code = c.codePointAt(0);
    if (c === '"') out += '\\"';
    else if (c === '\\') out += '\\\\';
    else if (c === '\n') out += '\\n';
    else if (c === '\r') out += '\\r';
    else if (c === '\t') out += '\\t';
    else if (c === '\0') out += '\\0';
    else if (code < 0x20 || (code >= 0x7f && code < 0xa0)) out += `\\u{${code.toString(16)}}`;
    else out += c;
  }
  return out + '"';
}

// Rust's `text.trim().parse::<u32>()`: ASCII digits with an optional '+'.
function parseU32(text) {
  let start = 0;
  let end = text.length;
  while (start < end && WHITE_SPACE.includes(text[start])) start++;
  while (end > start && WHITE_SPACE.includes(text[end - 1])) end--;
  let t = text.slice(start, end);
  if (t.startsWith('+')) t = t.slice(1);
  if (!/^[0-9]+$/.test(t)) return undefined;
  const n = Number(t); // exact up to 2^53; anything past U32_MAX is refused
  return n <= U32_MAX ? n : undefined;
}

function configFromParams(params) {
  const config = defaults();
  for (const [key, value] of params) {
    if (key === 'local_model') {
      config.localModel = value;
    } else if (key === 'cloud_upstream') {
      config.cloudUpstream = value;
    } else if (key === 'local_max_prompt_tokens') {
      const n = parseU32(value);
      if (n === undefined) {
        const message =
          'local_max_prompt_tokens must be a whole number of tokens, got ' + rustDebug(value);
        const error = new Error(message);
        error.payload = message; // the `err` of result<_, string>
        throw error;
      }
      config.localMaxPromptTokens = n;
    }
    // Other policies share the params table: unknown keys are not errors.
  }
  return config;
}

// No propensity: the reference policy does not explore.
function run(target, reason) {
  return { plan: { tag: 'run', val: target }, reason, propensity: undefined };
}

function decide(config, f) {
  const local = { tag: 'local', val: config.localModel };
  const cloud = { tag: 'cloud', val: config.cloudUpstream };

  // The guard would overrule a cloud answer anyway; saying "local" keeps
  // the reason honest, and the host fails closed if local is missing.
  if (!f.mayLeave) {
    return run(local, 'sensitive: stays local');
  }

  const localOk = f.localModels.includes(config.localModel);
  const cloudOk = f.cloudUpstreams.includes(config.cloudUpstream);
  const n = f.promptTokens;
  const t = config.localMaxPromptTokens;

  if (n <= t) {
    if (!localOk && cloudOk) {
      return run(cloud, 'local model unavailable');
    }
    return run(local, `short prompt (${n} <= ${t} tokens): local`);
  }
  if (!cloudOk) {
    return run(local, 'cloud upstream unavailable: local');
  }
  return run(cloud, `long prompt (${n} > ${t} tokens): cloud`);
}

// `configure` may never run; `route` then uses the defaults.
let current = defaults();
// Counters from `observe`: the state a learning policy would keep.
const counts = { observed: 0, failed: 0, servedLocal: 0, servedCloud: 0 };

function configure(params) {
  // Parse everything before storing, so a bad config changes nothing.
  current = configFromParams(params);
  // No costly signal (the prompt embedding) is needed: empty flags.
  return {};
}

function route(features) {
  return decide(current, features);
}

function observe(outcome) {
  counts.observed++;
  if (!outcome.ok) counts.failed++;
  if (outcome.servedBy?.tag === 'local') counts.servedLocal++;
  else if (outcome.servedBy?.tag === 'cloud') counts.servedCloud++;
}

export const router = { configure, route, observe };
