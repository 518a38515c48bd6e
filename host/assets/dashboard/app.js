// edgeroute live dashboard.
//
// Polls the node's public endpoints (/ledger, /healthz, /metrics) and, only
// when the node has admin enabled and the operator typed a token, the admin
// endpoints. No build step, no modules: one plain script after uPlot.
//
// Rules this file keeps (a browser test checks them):
//  - nothing is requested that the node does not serve (no admin call
//    without a token, no favicon, no source maps);
//  - no uncaught exceptions or promise rejections, and nothing written to
//    the console: failures are shown in the page instead.
'use strict';

(function () {
  /** Default poll period; `?interval_ms=N` in the page URL overrides it. */
  const DEFAULT_INTERVAL_MS = 2000;
  /** Never poll faster than this, whatever the URL says. */
  const MIN_INTERVAL_MS = 100;
  /** Points kept in the placements chart. */
  const MAX_POINTS = 300;
  /** Colours shared by the chart, the KPI tiles and the share bars (app.css). */
  const COLORS = { local: '#3fb68b', cloud: '#5b9cf5', refused: '#e5534b' };

  // ---------------------------------------------------------------------
  // Pure helpers (exposed on window.edgerouteDashboard for tests).
  // ---------------------------------------------------------------------

  /** Sums over the ledger's buckets, plus its money totals. */
  function ledgerTotals(ledger) {
    const t = { local: 0, cloud: 0, refused: 0, escalated: 0, cloudCostUsd: 0, costAvoidedUsd: 0, latencySavedMs: 0 };
    const buckets = (ledger && Array.isArray(ledger.buckets)) ? ledger.buckets : [];
    for (const b of buckets) {
      t.local += num(b.local && b.local.requests);
      t.cloud += num(b.cloud && b.cloud.requests);
      t.refused += num(b.refused);
      t.escalated += num(b.escalated);
    }
    const totals = (ledger && ledger.totals) || {};
    t.cloudCostUsd = num(totals.cloud_cost_usd);
    t.costAvoidedUsd = num(totals.cost_avoided_usd);
    t.latencySavedMs = num(totals.latency_saved_ms);
    return t;
  }

  function num(v) {
    return typeof v === 'number' && Number.isFinite(v) ? v : 0;
  }

  /**
   * Parses Prometheus / OpenMetrics text into [{name, labels, value}].
   * `#` lines (HELP, TYPE, UNIT, EOF) are skipped; label values may hold
   * escaped quotes, backslashes and newlines; a trailing timestamp or
   * exemplar is ignored. Malformed lines are skipped, never thrown on.
   */
  function parsePrometheus(text) {
    const samples = [];
    for (const raw of String(text).split('\n')) {
      const line = raw.trim();
      if (line === '' || line[0] === '#') continue;
      const s = parseSampleLine(line);
      if (s) samples.push(s);
    }
    return samples;
  }

  function parseSampleLine(line) {
    const m = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
    if (!m) return null;
    const name = m[0];
    let i = name.length;
    const labels = {};
    if (line[i] === '{') {
      i++;
      for (;;) {
        while (line[i] === ' ' || line[i] === ',') i++;
        if (line[i] === '}') { i++; break; }
        const lm = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
        if (!lm) return null;
        i += lm[0].length;
        while (line[i] === ' ') i++;
        if (line[i] !== '=') return null;
        i++;
        while (line[i] === ' ') i++;
        if (line[i] !== '"') return null;
        i++;
        let value = '';
        for (;;) {
          if (i >= line.length) return null;
          const c = line[i++];
          if (c === '"') break;
          if (c === '\\') {
            const e = line[i++];
            value += e === 'n' ? '\n' : e;
          } else {
            value += c;
          }
        }
        labels[lm[0]] = value;
      }
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = parseValue(rest[0]);
    if (value === null) return null;
    return { name, labels, value };
  }

  function parseValue(s) {
    if (s === undefined || s === '') return null;
    if (s === '+Inf' || s === 'Inf') return Infinity;
    if (s === '-Inf') return -Infinity;
    if (s === 'NaN') return NaN;
    const v = Number(s);
    return Number.isNaN(v) ? null : v;
  }

  /** Sum of the samples named `name` whose labels match `where`. */
  function sumOf(samples, name, where) {
    let total = 0;
    let seen = false;
    for (const s of samples) {
      if (s.name !== name || !labelsMatch(s.labels, where)) continue;
      if (Number.isFinite(s.value)) total += s.value;
      seen = true;
    }
    return seen ? total : null;
  }

  function labelsMatch(labels, where) {
    if (!where) return true;
    for (const k of Object.keys(where)) if (labels[k] !== where[k]) return false;
    return true;
  }

  /** Sum of `name` grouped by the values of the label `key`: {value: sum}. */
  function groupBy(samples, name, key) {
    const out = {};
    for (const s of samples) {
      if (s.name !== name || !Number.isFinite(s.value)) continue;
      const k = s.labels[key] === undefined ? '' : s.labels[key];
      out[k] = (out[k] || 0) + s.value;
    }
    return out;
  }

  /**
   * Histograms of family `base` keyed by the label `key` (e.g. placement):
   * {value: {buckets: [[le, cumulativeCount], ...] sorted by le, sum, count}}.
   * Other labels are summed over, which keeps buckets cumulative.
   */
  function histograms(samples, base, key) {
    const out = {};
    const get = (k) => (out[k] = out[k] || { byLe: new Map(), sum: 0, count: 0 });
    for (const s of samples) {
      const k = key ? (s.labels[key] || '') : '';
      if (s.name === base + '_bucket') {
        const le = parseValue(s.labels.le);
        if (le === null || Number.isNaN(le)) continue;
        const h = get(k);
        h.byLe.set(le, (h.byLe.get(le) || 0) + s.value);
      } else if (s.name === base + '_sum') {
        get(k).sum += s.value;
      } else if (s.name === base + '_count') {
        get(k).count += s.value;
      }
    }
    for (const k of Object.keys(out)) {
      const h = out[k];
      h.buckets = Array.from(h.byLe.entries()).sort((a, b) => a[0] - b[0]);
      delete h.byLe;
    }
    return out;
  }

  /**
   * Estimated q-quantile of a histogram, as Prometheus' histogram_quantile
   * does: linear interpolation inside the bucket holding the rank. A rank in
   * the +Inf bucket returns the highest finite bound (the true value is at
   * least that). Returns null without observations.
   */
  function histogramQuantile(h, q) {
    if (!h || !h.buckets || h.buckets.length === 0) return null;
    const total = h.buckets[h.buckets.length - 1][1];
    if (!(total > 0)) return null;
    const rank = q * total;
    let prevLe = 0;
    let prevCount = 0;
    for (const [le, count] of h.buckets) {
      if (count >= rank) {
        if (le === Infinity) return prevLe;
        const inBucket = count - prevCount;
        if (inBucket <= 0) return le;
        return prevLe + (le - prevLe) * ((rank - prevCount) / inBucket);
      }
      prevLe = le;
      prevCount = count;
    }
    return prevLe;
  }

  function histogramMean(h) {
    return h && h.count > 0 ? h.sum / h.count : null;
  }

  // ---------------------------------------------------------------------
  // Formatting.
  // ---------------------------------------------------------------------

  const dash = '–';

  function fmtInt(v) {
    return v === null || v === undefined || !Number.isFinite(v) ? dash : String(Math.round(v));
  }

  function fmtUsd(v) {
    return Number.isFinite(v) ? v.toFixed(6) : dash;
  }

  /** Seconds → "850 ms" / "1.24 s". */
  function fmtSeconds(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return dash;
    if (s === 0) return '0 ms';
    if (s < 0.001) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 0.01) return (s * 1000).toFixed(2) + ' ms';
    if (s < 1) return (s * 1000).toFixed(0) + ' ms';
    return s.toFixed(2) + ' s';
  }

  function fmtMs(ms) {
    return ms === null || ms === undefined || !Number.isFinite(ms) ? dash : ms.toFixed(0);
  }

  function fmtPct(x) {
    return x === null || x === undefined || !Number.isFinite(x) ? dash : (x * 100).toFixed(1) + '%';
  }

  function fmtUptime(s) {
    if (!Number.isFinite(s)) return dash;
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h ${m}m`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s % 60}s`;
    return `${s}s`;
  }

  function fmtBytes(b) {
    if (!Number.isFinite(b)) return dash;
    if (b < 1024) return b + ' B';
    if (b < 1024 * 1024) return (b / 1024).toFixed(1) + ' KiB';
    return (b / 1024 / 1024).toFixed(1) + ' MiB';
  }

  function shortId(id) {
    return typeof id === 'string' ? id.slice(0, 12) : dash;
  }

  function clock(d) {
    return d.toLocaleTimeString([], { hour12: false });
  }

  // ---------------------------------------------------------------------
  // DOM helpers. Text is always set with textContent: label values come
  // from requests (task names, policy sources) and must never be HTML.
  // ---------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  function setText(id, text) {
    const el = $(id);
    if (el && el.textContent !== text) el.textContent = text;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else e.setAttribute(k, v);
      }
    }
    for (const c of children) e.append(c);
    return e;
  }

  function td(text, cls) {
    return el('td', cls ? { class: cls, text } : { text });
  }

  function replaceRows(tbodyId, rows, emptyText, colspan) {
    const body = $(tbodyId);
    if (!body) return;
    if (rows.length === 0) {
      rows = [el('tr', { class: 'empty' }, el('td', { colspan: String(colspan), text: emptyText }))];
    }
    body.replaceChildren(...rows);
  }

  // ---------------------------------------------------------------------
  // Fetching.
  // ---------------------------------------------------------------------

  /** An error carrying the node's OpenAI error envelope, when there is one. */
  class NodeError extends Error {
    constructor(path, status, message, code) {
      super(message);
      this.path = path;
      this.status = status; // 0 when no HTTP response came back
      this.code = code;
    }
  }

  async function request(path, options, timeoutMs) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), timeoutMs);
    try {
      const res = await fetch(path, Object.assign({ cache: 'no-store', signal: ctl.signal }, options));
      if (!res.ok) {
        let message = `${res.status} ${res.statusText}`;
        let code;
        try {
          const body = await res.json();
          if (body && body.error) {
            message = body.error.message || message;
            code = body.error.code;
          }
        } catch (_) { /* not JSON: keep the status line */ }
        throw new NodeError(path, res.status, message, code);
      }
      return res;
    } catch (e) {
      if (e instanceof NodeError) throw e;
      throw new NodeError(path, 0, e && e.name === 'AbortError' ? 'timed out' : String(e && e.message ? e.message : e));
    } finally {
      clearTimeout(timer);
    }
  }

  // ---------------------------------------------------------------------
  // State.
  // ---------------------------------------------------------------------

  const state = {
    intervalMs: DEFAULT_INTERVAL_MS,
    refreshes: 0,
    lastSuccess: null,
    prevTotals: null, // ledger totals at the previous successful poll
    series: [[], [], [], []], // uPlot data: x (unix s), local, cloud, refused
    chart: null,
    adminEnabled: false,
    token: null, // kept in memory only, never in storage
    adminBusy: false,
    rollbackArmed: null, // timer while the Rollback button asks to confirm
  };

  function readInterval() {
    const v = Number(new URLSearchParams(location.search).get('interval_ms'));
    return Number.isFinite(v) && v > 0 ? Math.max(MIN_INTERVAL_MS, Math.floor(v)) : DEFAULT_INTERVAL_MS;
  }

  // ---------------------------------------------------------------------
  // Rendering of public data.
  // ---------------------------------------------------------------------

  function renderHealth(h) {
    const status = String(h.status || 'unknown');
    setText('node-status', status);
    $('node-status').className = status === 'ok' ? 'ok' : 'warn';
    setText('policy-id', shortId(h.policy));
    $('policy-id').title = h.policy || '';
    setText('policy-source', h.policy_source ? `(${h.policy_source})` : '');
    setText('uptime', fmtUptime(h.uptime_s));
    setText('local-models', (h.local_models || []).join(', ') || 'none');
    setText('cloud-upstreams', (h.cloud_upstreams || []).join(', ') || 'none');
  }

  function renderTotals(t) {
    setText('total-local', String(t.local));
    setText('total-cloud', String(t.cloud));
    setText('total-refused', String(t.refused));
    setText('total-escalated', String(t.escalated));
    setText('cloud-spend-usd', fmtUsd(t.cloudCostUsd));
    setText('cost-avoided-usd', fmtUsd(t.costAvoidedUsd));
    setText('spend-ledger', '$' + fmtUsd(t.cloudCostUsd));
    setText('latency-saved', fmtSeconds(t.latencySavedMs / 1000));
    const served = t.local + t.cloud;
    setText('local-share', served ? fmtPct(t.local / served) : dash);
  }

  function renderBuckets(ledger) {
    const rows = [];
    for (const b of (ledger.buckets || [])) {
      const local = num(b.local && b.local.requests);
      const cloud = num(b.cloud && b.cloud.requests);
      const served = local + cloud;
      const share = served ? local / served : null;
      // The bar is a <meter>-like pair of spans sized with CSSOM (not a
      // style attribute), which a strict CSP allows.
      const fill = el('span', { class: 'bar-fill' });
      fill.style.width = share === null ? '0%' : (share * 100).toFixed(1) + '%';
      const bar = el('span', { class: 'bar' + (share === null ? ' bar-none' : '') }, fill);
      rows.push(el('tr', null,
        td(b.prompt_tokens), td(b.task), td(b.sensitivity, 'sens sens-' + b.sensitivity), td(b.latency_budget), td(b.confidence),
        td(String(local), 'num'), td(String(cloud), 'num'), td(String(num(b.refused)), 'num'), td(String(num(b.escalated)), 'num'),
        el('td', { class: 'share' }, bar, el('span', { class: 'share-pct', text: fmtPct(share) })),
        td(`${fmtMs(b.local && b.local.mean_latency_ms)} / ${fmtMs(b.cloud && b.cloud.mean_latency_ms)}`, 'num'),
        td(fmtUsd(num(b.cloud && b.cloud.cost_usd)), 'num'), td(fmtUsd(num(b.cost_avoided_usd)), 'num')));
    }
    replaceRows('buckets-body', rows, 'No requests yet', 13);
  }

  const PLACEMENT_ORDER = ['local', 'cloud', 'peer', 'none'];
  const byPlacement = (a, b) => {
    const ia = PLACEMENT_ORDER.indexOf(a), ib = PLACEMENT_ORDER.indexOf(b);
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
  };

  function renderMetrics(samples) {
    // Latency, TTFT and generation speed per placement.
    const dur = histograms(samples, 'edgeroute_request_duration_seconds', 'placement');
    const ttft = histograms(samples, 'edgeroute_time_to_first_token_seconds', 'placement');
    const tps = histograms(samples, 'edgeroute_generation_tokens_per_second', 'placement');
    const placements = Array.from(new Set([...Object.keys(dur), ...Object.keys(ttft), ...Object.keys(tps)]))
      .filter((p) => (dur[p] && dur[p].count) || (ttft[p] && ttft[p].count) || (tps[p] && tps[p].count))
      .sort(byPlacement);
    replaceRows('latency-body', placements.map((p) => el('tr', null,
      td(p, 'placement placement-' + p),
      td(fmtInt(dur[p] ? dur[p].count : 0), 'num'),
      td(fmtSeconds(histogramMean(dur[p])), 'num'),
      td(fmtSeconds(histogramQuantile(dur[p], 0.5)), 'num'),
      td(fmtSeconds(histogramQuantile(dur[p], 0.95)), 'num'),
      td(fmtSeconds(histogramMean(ttft[p])), 'num'),
      td(fmtSeconds(histogramQuantile(ttft[p], 0.5)), 'num'),
      td(fmtSeconds(histogramQuantile(ttft[p], 0.95)), 'num'),
      td(tps[p] && tps[p].count ? histogramMean(tps[p]).toFixed(1) : dash, 'num'))), 'No requests yet', 9);

    // Requests by placement × reason.
    const reasons = new Map();
    for (const s of samples) {
      if (s.name !== 'edgeroute_requests_total' || !Number.isFinite(s.value)) continue;
      const key = (s.labels.placement || '') + '\u0000' + (s.labels.reason || '');
      reasons.set(key, (reasons.get(key) || 0) + s.value);
    }
    const reasonRows = Array.from(reasons.entries())
      .filter(([, v]) => v > 0)
      .map(([k, v]) => [k.split('\u0000'), v])
      .sort((a, b) => byPlacement(a[0][0], b[0][0]) || b[1] - a[1]);
    replaceRows('reasons-body', reasonRows.map(([[p, r], v]) =>
      el('tr', null, td(p, 'placement placement-' + p), td(r), td(fmtInt(v), 'num'))), 'No requests yet', 3);

    const causes = groupBy(samples, 'edgeroute_refusals_total', 'cause');
    replaceRows('refusals-body', Object.entries(causes).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1])
      .map(([c, v]) => el('tr', null, td(c), td(fmtInt(v), 'num'))), 'None', 2);

    // Local engine.
    setText('queue-depth', fmtInt(sumOf(samples, 'edgeroute_local_queue_depth')));
    setText('local-running', fmtInt(sumOf(samples, 'edgeroute_local_running')));
    setText('estimated-wait', fmtSeconds(sumOf(samples, 'edgeroute_local_estimated_wait_seconds')));

    // Egress.
    setText('egress-allowed', fmtInt(sumOf(samples, 'edgeroute_egress_allowed_total') || 0));
    setText('egress-refused-sensitivity', fmtInt(sumOf(samples, 'edgeroute_egress_refused_total', { reason: 'sensitivity' }) || 0));
    setText('egress-refused-host', fmtInt(sumOf(samples, 'edgeroute_egress_refused_total', { reason: 'host' }) || 0));

    // Policy.
    const failures = groupBy(samples, 'edgeroute_policy_failures_total', 'kind');
    for (const kind of ['trap', 'timeout', 'memory']) {
      const v = failures[kind] || 0;
      setText('policy-failures-' + kind, fmtInt(v));
      $('policy-failures-' + kind).className = v > 0 ? 'warn' : '';
    }
    setText('policy-swaps', fmtInt(sumOf(samples, 'edgeroute_policy_swaps_total') || 0));
    setText('policy-rollbacks', fmtInt(sumOf(samples, 'edgeroute_policy_rollbacks_total') || 0));
    // Only the active policy's call time: the family keeps old versions too.
    const info = samples.find((s) => s.name === 'edgeroute_policy_info' && s.value === 1);
    const calls = histograms(samples, 'edgeroute_policy_call_duration_seconds', 'policy');
    const active = info && calls[info.labels.policy] ? calls[info.labels.policy] : null;
    setText('policy-call-time', active && active.count
      ? `${fmtSeconds(histogramMean(active))} / ${fmtSeconds(histogramQuantile(active, 0.95))}` : dash);

    // Spend counters (the ledger's totals are the KPI tiles).
    const spend = sumOf(samples, 'edgeroute_cloud_spend_usd_total');
    const avoided = sumOf(samples, 'edgeroute_cloud_cost_avoided_usd_total');
    setText('spend-metric', spend === null ? dash : '$' + fmtUsd(spend));
    setText('avoided-metric', avoided === null ? dash : '$' + fmtUsd(avoided));

    // Shadow comparison (public counters).
    const compared = sumOf(samples, 'edgeroute_shadow_compared_total') || 0;
    const agreed = sumOf(samples, 'edgeroute_shadow_agreed_total') || 0;
    setText('shadow-compared', fmtInt(compared));
    setText('shadow-agreed', fmtInt(agreed));
    setText('shadow-rate', compared ? fmtPct(agreed / compared) : dash);

    const build = samples.find((s) => s.name === 'edgeroute_build_info');
    setText('build-version', build && build.labels.version ? build.labels.version : dash);
  }

  // ---------------------------------------------------------------------
  // Placements chart.
  // ---------------------------------------------------------------------

  function chartSize() {
    const box = $('placements-chart');
    return { width: Math.max(200, box.clientWidth), height: 240 };
  }

  function makeChart() {
    if (typeof uPlot !== 'function') {
      setText('placements-chart', 'chart library failed to load');
      return null;
    }
    const axis = {
      stroke: '#8b949e',
      grid: { stroke: 'rgba(139,148,158,0.15)', width: 1 },
      ticks: { stroke: 'rgba(139,148,158,0.3)', width: 1 },
      font: '11px system-ui, sans-serif',
    };
    const series = (label, color) => ({
      label,
      stroke: color,
      width: 2,
      fill: color + '22',
      // Each point counts the requests of the interval that ends at it,
      // so the step is drawn backwards over that interval.
      paths: uPlot.paths.stepped({ align: -1 }),
      points: { show: false },
      value: (u, v) => (v === null || v === undefined ? dash : String(v)),
    });
    const opts = Object.assign(chartSize(), {
      cursor: { drag: { x: false, y: false } },
      legend: { live: true },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [Object.assign({}, axis), Object.assign({ size: 44 }, axis)],
      series: [
        {},
        series('local', COLORS.local),
        series('cloud', COLORS.cloud),
        series('refused', COLORS.refused),
      ],
    });
    const chart = new uPlot(opts, state.series, $('placements-chart'));
    // Follow the card's width (the grid reflows on resize).
    if (typeof ResizeObserver === 'function') {
      new ResizeObserver(() => chart.setSize(chartSize())).observe($('placements-chart'));
    }
    return chart;
  }

  /** Adds one point: requests per placement since the previous poll. */
  function pushPlacements(totals, now) {
    const prev = state.prevTotals;
    state.prevTotals = totals;
    if (!prev) return; // the first poll has nothing to subtract from
    // A counter that went down means the node restarted: count from zero.
    const delta = (k) => (totals[k] >= prev[k] ? totals[k] - prev[k] : totals[k]);
    const [xs, l, c, r] = state.series;
    xs.push(now / 1000);
    l.push(delta('local'));
    c.push(delta('cloud'));
    r.push(delta('refused'));
    if (xs.length > MAX_POINTS) for (const s of state.series) s.splice(0, s.length - MAX_POINTS);
    if (state.chart) state.chart.setData(state.series);
  }

  // ---------------------------------------------------------------------
  // Polling.
  // ---------------------------------------------------------------------

  async function refresh() {
    const timeout = Math.max(5000, state.intervalMs * 2);
    const [ledger, health, metricsText] = await Promise.all([
      // A node with client keys shows its ledger only to the admin token:
      // without one, a 401 leaves the ledger panels empty, not the page down.
      request('/ledger', state.token ? { headers: adminHeaders() } : null, timeout)
        .then((r) => r.json())
        .catch((e) => { if (e instanceof NodeError && e.status === 401) return null; throw e; }),
      request('/healthz', null, timeout).then((r) => r.json()),
      request('/metrics', null, timeout).then((r) => r.text()),
    ]);
    const now = Date.now();
    const totals = ledgerTotals(ledger);
    renderHealth(health);
    renderTotals(totals);
    renderBuckets(ledger || {});
    renderMetrics(parsePrometheus(metricsText));
    pushPlacements(totals, now);
    setAdminEnabled(health.admin_enabled === true);
    if (state.token && !state.adminBusy) await refreshAdmin();
    return now;
  }

  function markUp(now) {
    state.refreshes++;
    state.lastSuccess = now;
    document.body.dataset.refreshes = String(state.refreshes);
    document.body.dataset.ready = '1';
    document.body.dataset.state = 'ok';
    $('banner').hidden = true;
    const status = $('status');
    status.textContent = 'live';
    status.className = 'pill pill-ok';
    setText('updated-at', clock(new Date(now)));
  }

  function markDown(err) {
    document.body.dataset.state = 'unreachable';
    const since = state.lastSuccess ? ` (last update ${clock(new Date(state.lastSuccess))})` : '';
    const banner = $('banner');
    let detail = '';
    if (err instanceof NodeError) detail = ` ${err.path}: ${err.status ? 'HTTP ' + err.status + ', ' : ''}${err.message}`;
    else if (err && err.message) detail = ' ' + err.message; // e.g. a malformed body
    banner.textContent = `Node unreachable — retrying every ${state.intervalMs} ms${since}.${detail}`;
    banner.hidden = false;
    const status = $('status');
    status.textContent = 'unreachable';
    status.className = 'pill pill-bad';
    setText('node-status', 'unreachable');
    $('node-status').className = 'bad';
  }

  // A chain of timeouts rather than setInterval: a slow node never gets a
  // second poll while the first is still out.
  async function loop() {
    try {
      markUp(await refresh());
    } catch (e) {
      markDown(e);
    }
    setTimeout(loop, state.intervalMs);
  }

  // ---------------------------------------------------------------------
  // Admin.
  // ---------------------------------------------------------------------

  function adminHeaders(extra) {
    return Object.assign({ Authorization: 'Bearer ' + state.token }, extra || {});
  }

  function adminMessage(text, kind) {
    const m = $('admin-message');
    m.textContent = text || '';
    m.className = 'message' + (kind ? ' message-' + kind : '');
    m.hidden = !text;
  }

  function setAdminEnabled(enabled) {
    if (enabled === state.adminEnabled && document.body.dataset.admin) return;
    state.adminEnabled = enabled;
    $('admin-off').hidden = enabled;
    $('admin-token-form').hidden = !enabled;
    if (!enabled) forgetToken(); // the node turned admin off: drop the token
    updateAdminMode();
  }

  function updateAdminMode() {
    const mode = !state.adminEnabled ? 'off' : state.token ? 'unlocked' : 'locked';
    document.body.dataset.admin = mode;
    $('admin-panel').hidden = mode !== 'unlocked';
    $('shadow-admin').hidden = mode !== 'unlocked';
    $('admin-lock').hidden = mode !== 'unlocked';
    $('admin-unlock').disabled = !state.adminEnabled;
    $('admin-token').disabled = !state.adminEnabled;
    for (const id of ['rollback-btn', 'swap-btn', 'shadow-start-btn', 'shadow-stop-btn', 'swap-file', 'shadow-file']) {
      $(id).disabled = mode !== 'unlocked' || state.adminBusy;
    }
    if (mode === 'unlocked' && !state.adminBusy) {
      $('swap-btn').disabled = !$('swap-file').files.length;
      $('shadow-start-btn').disabled = !$('shadow-file').files.length;
    }
  }

  function forgetToken() {
    state.token = null;
    $('admin-token').value = '';
    $('policy-history-body').replaceChildren();
    disarmRollback();
    updateAdminMode();
  }

  /** A rejected token is dropped at once so polling does not repeat 401s. */
  function handleAdminError(e, what) {
    if (e.status === 401) {
      forgetToken();
      adminMessage('Admin token rejected: ' + e.message, 'error');
    } else {
      adminMessage(`${what} failed: ${e.message}`, 'error');
    }
  }

  async function refreshAdmin() {
    try {
      const timeout = Math.max(5000, state.intervalMs * 2);
      const [policy, shadow] = await Promise.all([
        request('/admin/policy', { headers: adminHeaders() }, timeout).then((r) => r.json()),
        request('/admin/shadow', { headers: adminHeaders() }, timeout).then((r) => r.json()),
      ]);
      if (!state.token) return; // forgotten while the request was out
      renderPolicyHistory(policy);
      renderShadowAdmin(shadow);
      updateAdminMode();
    } catch (e) {
      handleAdminError(e, 'Reading admin state');
    }
  }

  function renderPolicyHistory(p) {
    const row = (v, role) => el('tr', { class: 'role-' + role },
      el('td', null, el('span', { class: 'badge badge-' + role, text: role })),
      el('td', null, el('code', { title: v.id || '', text: shortId(v.id) })),
      td(v.source || dash),
      td(Number.isFinite(v.loaded_at) ? new Date(v.loaded_at * 1000).toLocaleString([], { hour12: false }) : dash),
      td(fmtBytes(v.size_bytes), 'num'),
      td(Number.isFinite(v.load_ms) ? v.load_ms.toFixed(1) : dash, 'num'),
      td(v.stateful ? 'yes' : 'no'),
      td(v.world || dash, 'small'),
      td(fmtInt(v.calls), 'num'),
      td(fmtInt(v.failures), 'num' + (v.failures > 0 ? ' warn' : '')),
      td(fmtBytes(v.memory_bytes), 'num'));
    const rows = [];
    if (p && p.active) rows.push(row(p.active, 'active'));
    for (const v of (p && p.previous) || []) rows.push(row(v, 'previous'));
    if (p && p.shadow) rows.push(row(p.shadow, 'shadow'));
    replaceRows('policy-history-body', rows, 'No policy', 11);
    $('rollback-btn').title = p && p.previous && p.previous.length
      ? 'Make ' + shortId(p.previous[0].id) + ' active again' : 'No previous version to roll back to';
  }

  function renderShadowAdmin(s) {
    const hasCandidate = s && s.candidate;
    setText('shadow-candidate', hasCandidate ? `${shortId(s.candidate.id)} (${s.candidate.source || ''})` : 'none');
    const diffs = (hasCandidate && Array.isArray(s.differences)) ? s.differences : [];
    replaceRows('shadow-differences', diffs.slice().sort((a, b) => b.requests - a.requests)
      .map((d) => el('tr', null, td(String(d.live)), td(String(d.candidate)), td(fmtInt(d.requests), 'num'))),
    hasCandidate ? 'No differences' : 'No candidate running', 3);
    $('shadow-differences').closest('table').hidden = !hasCandidate;
    $('shadow-by-sensitivity').closest('table').hidden = !hasCandidate;
    const by = (hasCandidate && s.by_sensitivity) || {};
    replaceRows('shadow-by-sensitivity', Object.entries(by).map(([k, v]) =>
      el('tr', null, td(k), td(fmtInt(v.compared), 'num'), td(fmtPct(v.agreement_rate), 'num'))), '–', 3);
  }

  /** Runs one admin action with the buttons disabled, then re-reads state. */
  async function adminAction(what, fn) {
    if (!state.token || state.adminBusy) return;
    state.adminBusy = true;
    updateAdminMode();
    adminMessage(what + '…', 'info');
    try {
      const text = await fn();
      adminMessage(text, 'ok');
    } catch (e) {
      handleAdminError(e, what);
    } finally {
      state.adminBusy = false;
      updateAdminMode();
    }
    if (state.token) await refreshAdmin();
  }

  function disarmRollback() {
    if (state.rollbackArmed) clearTimeout(state.rollbackArmed);
    state.rollbackArmed = null;
    const b = $('rollback-btn');
    b.textContent = 'Rollback';
    b.classList.remove('armed');
  }

  // Rollback asks for a second click instead of a native confirm() dialog,
  // which would block the page (and a WebDriver test).
  function onRollback() {
    if (!state.rollbackArmed) {
      const b = $('rollback-btn');
      b.textContent = 'Click again to roll back';
      b.classList.add('armed');
      state.rollbackArmed = setTimeout(disarmRollback, 4000);
      return;
    }
    disarmRollback();
    adminAction('Rollback', async () => {
      const body = await (await request('/admin/policy/rollback', { method: 'POST', headers: adminHeaders() }, 30000)).json();
      return `Rolled back: ${shortId(body.active && body.active.id)} is active`;
    });
  }

  function uploadWasm(inputId, path, what, describe) {
    const file = $(inputId).files[0];
    if (!file) return;
    adminAction(what, async () => {
      const res = await request(path, {
        method: 'PUT',
        headers: adminHeaders({ 'Content-Type': 'application/wasm' }),
        body: file,
      }, 60000);
      const body = await res.json();
      $(inputId).value = '';
      return describe(body, file);
    });
  }

  function wireAdmin() {
    $('admin-token-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const token = $('admin-token').value.trim();
      if (!token || !state.adminEnabled) return;
      state.token = token;
      adminMessage('', null);
      updateAdminMode();
      refreshAdmin();
    });
    $('admin-lock').addEventListener('click', () => {
      forgetToken();
      adminMessage('Token forgotten', 'info');
    });
    $('rollback-btn').addEventListener('click', onRollback);
    $('swap-file').addEventListener('change', updateAdminMode);
    $('shadow-file').addEventListener('change', updateAdminMode);
    $('swap-btn').addEventListener('click', () => uploadWasm('swap-file', '/admin/policy', 'Swap',
      (b, f) => `Swapped in ${f.name}: ${shortId(b.active && b.active.id)} is active`));
    $('shadow-start-btn').addEventListener('click', () => uploadWasm('shadow-file', '/admin/shadow', 'Start shadow',
      (b, f) => `Shadowing ${f.name} as ${shortId(b.candidate && b.candidate.id)}`));
    $('shadow-stop-btn').addEventListener('click', () => adminAction('Stop shadow', async () => {
      const body = await (await request('/admin/shadow', { method: 'DELETE', headers: adminHeaders() }, 30000)).json();
      return body && body.candidate
        ? `Shadow stopped after ${fmtInt(body.compared)} comparisons (${fmtPct(body.agreement_rate)} agreed)`
        : 'No shadow was running';
    }));
  }

  // ---------------------------------------------------------------------
  // Start.
  // ---------------------------------------------------------------------

  function start() {
    state.intervalMs = readInterval();
    setText('interval-ms', String(state.intervalMs));
    setText('interval-label', `(requests per ${state.intervalMs / 1000} s)`);
    state.chart = makeChart();
    wireAdmin();
    setAdminEnabled(false);
    loop();
  }

  window.edgerouteDashboard = { ledgerTotals, parsePrometheus, histograms, histogramQuantile, histogramMean, state };

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
