// A routing policy in JavaScript for edgeroute (world
// `edgeroute:routing/policy@0.2.0`, in `wit/`).
//
// Short prompts run on the first local model, long ones on the first cloud
// upstream; a request that may not leave stays local, or is rejected when
// no local model is loaded. It logs through the node (`host.log`) and reads
// the node's clock (`host.nowMs`): no WASI needed.
//
// WIT to JavaScript (jco / componentize-js):
// - the exported interface `router` is the module's export `router`, an
//   object with its functions;
// - records are objects with camelCase fields (`prompt-tokens` →
//   `promptTokens`), a variant is `{ tag, val }`, an enum case is its name
//   as a string (`'info'`), `option<T>` is the value or `undefined`, flags
//   are an object of booleans (`{}`: none), a u64 is a BigInt (`nowMs()`);
// - throwing from a function that returns `result<_, string>` answers its
//   `err`: the thrown error's `payload`.

import { log, nowMs } from 'edgeroute:routing/host@0.2.0';

const U32_MAX = 0xffffffff;

// Prompts up to this many tokens run locally (`[policy.params]
// local_max_prompt_tokens`).
let localMaxPromptTokens = 512;

// A whole number of tokens (a u32), or undefined.
function parseTokens(text) {
  const t = text.trim();
  if (!/^\+?[0-9]+$/.test(t)) return undefined;
  const n = Number(t);
  return n <= U32_MAX ? n : undefined;
}

function configure(params) {
  let tokens = localMaxPromptTokens;
  for (const [key, value] of params) {
    if (key === 'local_max_prompt_tokens') {
      tokens = parseTokens(value);
      if (tokens === undefined) {
        const message = `${key} must be a whole number of tokens, got ${JSON.stringify(value)}`;
        const error = new Error(message);
        error.payload = message; // the `err` of result<needs, string>
        throw error;
      }
    }
  }
  localMaxPromptTokens = tokens;
  log('info', `configured: local_max_prompt_tokens=${localMaxPromptTokens}`);
  // No costly signal (the prompt embedding) is needed: empty flags.
  return {};
}

function run(target, reason) {
  return { plan: { tag: 'run', val: target }, reason, propensity: undefined };
}

function reject(why, reason) {
  return { plan: { tag: 'reject', val: why }, reason, propensity: undefined };
}

function decide(f) {
  const hasLocal = f.localModels.length > 0;
  const hasCloud = f.cloudUpstreams.length > 0;
  const isShort = f.promptTokens <= localMaxPromptTokens;
  if (!f.mayLeave && !hasLocal) {
    // Naming a local model that is not loaded would also fail closed;
    // `reject` says why.
    return reject(
      'this request may not leave and no local model is loaded',
      'sensitive, no local model: reject',
    );
  }
  if (!f.mayLeave) {
    return run({ tag: 'local', val: f.localModels[0] }, 'sensitive: stays local');
  }
  if (hasLocal && (isShort || !hasCloud)) {
    return run({ tag: 'local', val: f.localModels[0] }, 'short prompt: local');
  }
  if (hasCloud) {
    return run({ tag: 'cloud', val: f.cloudUpstreams[0] }, 'long prompt: cloud');
  }
  return reject('no target is configured', 'no target: reject');
}

function route(features) {
  const decision = decide(features);
  log('debug', `routed a prompt at (ms since the epoch) ${nowMs()}`);
  return decision;
}

function observe(outcome) {
  if (!outcome.ok) {
    log('warn', 'a request this policy placed failed');
  }
}

export const router = { configure, route, observe };
