//! What an operator sees: `/metrics` (checked by Prometheus's own
//! `promtool`), the egress audit log, and the dashboard in a real headless
//! Chromium — each after a scripted burst whose every request is known, so
//! each number has one right value.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use edgeroute_testkit::{Browser, FakeCloud, Node, Resp, unique};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::{POLICY_ALWAYS_CLOUD, POLICY_TRAP};

fn chat(prompt: &str, stream: bool) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
    })
}

fn post(node: &Node, prompt: &str, stream: bool, sensitivity: Option<&str>) -> Resp {
    let headers: Vec<(&str, &str)> = sensitivity
        .map(|s| vec![("x-edgeroute-sensitivity", s)])
        .unwrap_or_default();
    node.post_json("/v1/chat/completions", chat(prompt, stream), &headers)
}

/// A prompt of about `words` words that starts with `canary` (a word no
/// line of the audit log may contain).
fn prompt(canary: &str, words: usize) -> String {
    let mut text = format!("{canary} please summarise:");
    for i in 0..words {
        text.push_str(&format!(" item{}", i % 97));
    }
    text
}

/// Samples of the Prometheus text: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The value of the sample whose name is `name` and whose labels include
/// every `labels` pair (0 when there is none).
fn sample(samples: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v)
        .sum()
}

/// `promtool check metrics` on the node's exposition: the format parses
/// and the names follow Prometheus's conventions.
#[track_caller]
pub(crate) fn promtool_passes(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; `./dev test` installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}\n--- exposition ---\n{text}"
    );
}

/// The audit log's lines once it has `expected` of them. A background
/// thread writes them (in order) right after the requests that queued
/// them; a second read a moment later catches any line too many.
#[track_caller]
fn audit_lines(node: &Node, expected: usize) -> Vec<Value> {
    let read = || -> Vec<Value> {
        std::fs::read_to_string(node.audit_log())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while read().len() < expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    read()
}

fn metrics(node: &Node) -> (String, BTreeMap<String, f64>) {
    let resp = node.get("/metrics");
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(
        resp.header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{resp:?}"
    );
    let text = resp.body_text.clone();
    let parsed = samples(&text);
    (text, parsed)
}

#[test]
fn metrics_and_the_audit_log_account_for_every_request_of_a_burst() {
    let cloud = FakeCloud::start();
    let decisions = std::env::temp_dir().join(format!("{}.jsonl", unique("decisions")));
    let node = EDGEROUTE
        .node(&cloud)
        .arg("--decision-log")
        .arg(decisions.display().to_string())
        .start();
    let canary = unique("auditcanary");

    // Two short public prompts (local), one long public one, streamed (the
    // default policy sends it to the cloud), one short restricted prompt
    // (local) and one restricted prompt longer than the local context
    // (refused: it may not leave and cannot run here).
    for _ in 0..2 {
        let resp = post(&node, &format!("{canary} hi"), false, None);
        assert_eq!(resp.target(), Some("local:smollm2"), "{resp:?}");
    }
    let long = post(&node, &prompt(&canary, 120), true, None);
    assert_eq!(long.target(), Some("cloud:frontier"), "{long:?}");
    assert_eq!(long.stream().text, edgeroute_testkit::CLOUD_REPLY);
    let kept = post(
        &node,
        &format!("{canary} secret"),
        false,
        Some("restricted"),
    );
    assert_eq!(kept.target(), Some("local:smollm2"), "{kept:?}");
    let refused = post(&node, &prompt(&canary, 3000), false, Some("restricted"));
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.json()["error"]["code"], "prompt_too_long");

    let (text, m) = metrics(&node);
    promtool_passes(&text);
    let requests = |placement: &str, reason: &str, sensitivity: &str, status: &str| {
        sample(
            &m,
            "edgeroute_requests_total",
            &[
                ("placement", placement),
                ("reason", reason),
                ("sensitivity", sensitivity),
                ("status", status),
            ],
        )
    };
    assert_eq!(requests("local", "policy", "public", "ok"), 2.0, "{text}");
    assert_eq!(requests("cloud", "policy", "public", "ok"), 1.0, "{text}");
    assert_eq!(
        requests("local", "policy", "restricted", "ok"),
        1.0,
        "{text}"
    );
    assert_eq!(
        requests("none", "refused", "restricted", "refused"),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&m, "edgeroute_requests_total", &[]), 5.0, "{text}");
    assert_eq!(
        sample(
            &m,
            "edgeroute_refusals_total",
            &[("cause", "prompt_too_long")]
        ),
        1.0
    );
    let count = |name: &str, placement: &str| sample(&m, name, &[("placement", placement)]);
    assert_eq!(
        count("edgeroute_request_duration_seconds_count", "local"),
        3.0
    );
    assert_eq!(
        count("edgeroute_request_duration_seconds_count", "cloud"),
        1.0
    );
    // Only the streamed answer has a first token apart from its end.
    assert_eq!(
        count("edgeroute_time_to_first_token_seconds_count", "cloud"),
        1.0
    );
    assert_eq!(
        count("edgeroute_time_to_first_token_seconds_count", "local"),
        0.0
    );
    // The cloud call's wait on its upstream, by the upstream's name.
    let upstream = |name: &str| sample(&m, name, &[("upstream", "frontier")]);
    assert_eq!(
        upstream("edgeroute_upstream_wait_seconds_count"),
        1.0,
        "{text}"
    );
    assert!(
        upstream("edgeroute_upstream_wait_seconds_sum") > 0.0,
        "{text}"
    );
    assert_eq!(
        sample(&m, "edgeroute_policy_call_duration_seconds_count", &[]),
        5.0,
        "every request asked the policy once"
    );
    assert_eq!(sample(&m, "edgeroute_egress_allowed_total", &[]), 1.0);
    assert!(
        sample(&m, "edgeroute_idle_poll_seconds_total", &[]) > 0.0,
        "connection threads polled after these requests ([limits] idle_poll_us): {text}"
    );
    assert_eq!(
        sample(&m, "edgeroute_cloud_fetch_unpooled_total", &[]),
        0.0,
        "one cloud call at a time runs on a pooled instance"
    );
    assert_eq!(
        sample(&m, "edgeroute_egress_refused_total", &[]),
        0.0,
        "nothing tried to leave that may not"
    );
    // Money matches the ledger to the cent's billionth.
    let totals = node.get("/ledger").json()["totals"].clone();
    for (metric, field) in [
        ("edgeroute_cloud_spend_usd_total", "cloud_cost_usd"),
        ("edgeroute_cloud_cost_avoided_usd_total", "cost_avoided_usd"),
    ] {
        let ledger = totals[field].as_f64().unwrap();
        assert!(ledger > 0.0, "{totals}");
        assert!(
            (sample(&m, metric, &[]) - ledger).abs() < 1e-12,
            "{metric}: {text}"
        );
    }
    let active = node.get("/healthz").json()["policy"].clone();
    assert_eq!(
        sample(
            &m,
            "edgeroute_policy_info",
            &[("policy", active.as_str().unwrap())]
        ),
        1.0
    );

    // Exactly one audit line: the cloud call, with what went out and none
    // of the text.
    let lines = audit_lines(&node, 1);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let line = &lines[0];
    let sent = cloud.chat_requests();
    assert_eq!(sent.len(), 1, "{}", cloud.describe());
    assert_eq!(line["event"], "egress");
    assert_eq!(line["target"], "cloud:frontier");
    assert_eq!(line["policy"], active);
    assert_eq!(line["sensitivity"], "public");
    assert_eq!(line["ok"], true);
    assert_eq!(line["bytes_sent"], sent[0].body_text.len() as u64);
    assert!(line["prompt_tokens"].as_u64().unwrap() > 120, "{line}");
    assert!(line["completion_tokens"].as_u64().unwrap() > 0, "{line}");
    assert!(line["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let raw = std::fs::read_to_string(node.audit_log()).unwrap();
    assert!(
        !raw.contains(&canary),
        "the audit log holds prompt text: {raw}"
    );

    // The traffic report from the same node's decision log counts the same
    // requests: 3 local, 1 cloud, 1 refused, nothing escalated.
    let report = node.dir().join("report.html");
    let out = EDGEROUTE
        .command()
        .arg("report")
        .arg(&decisions)
        .arg("--output")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(
        html.contains("<td>3</td><td>1</td><td>1</td><td>0</td>"),
        "{html}"
    );
    assert!(html.contains("<svg") && !html.contains(&canary));
    std::fs::remove_file(&decisions).ok();
}

#[test]
fn a_refused_egress_and_a_policy_trap_are_counted_and_audited() {
    let cloud = FakeCloud::start();
    let canary = unique("guardcanary");

    // A policy that always answers cloud, asked about a restricted prompt:
    // the guard keeps it local and the audit log records the refusal.
    let node = EDGEROUTE
        .node(&cloud)
        .policy_component(POLICY_ALWAYS_CLOUD)
        .start();
    let kept = post(
        &node,
        &format!("{canary} payroll"),
        false,
        Some("restricted"),
    );
    assert_eq!(kept.target(), Some("local:smollm2"), "{kept:?}");
    let public = post(&node, &format!("{canary} hello"), false, None);
    assert_eq!(public.target(), Some("cloud:frontier"), "{public:?}");
    assert_eq!(cloud.chat_requests().len(), 1, "{}", cloud.describe());
    cloud.assert_received(&format!("{canary} payroll"), 0);

    let lines = audit_lines(&node, 2);
    let events: Vec<(&str, Option<&str>)> = lines
        .iter()
        .map(|l| (l["event"].as_str().unwrap(), l["refused_by"].as_str()))
        .collect();
    assert_eq!(
        events,
        [("refused", Some("guard")), ("egress", None)],
        "{lines:#?}"
    );
    assert_eq!(lines[0]["sensitivity"], "restricted");
    assert_eq!(lines[0]["target"], "cloud:frontier");
    assert_eq!(lines[0]["bytes_sent"], 0);
    assert!(
        !std::fs::read_to_string(node.audit_log())
            .unwrap()
            .contains(&canary)
    );
    let (text, m) = metrics(&node);
    promtool_passes(&text);
    assert_eq!(
        sample(
            &m,
            "edgeroute_requests_total",
            &[("placement", "local"), ("reason", "override")]
        ),
        1.0,
        "{text}"
    );
    drop(node);

    // A policy that traps: the safe default serves, and the failure is
    // counted by kind under the version that failed.
    let node = EDGEROUTE.node(&cloud).policy_component(POLICY_TRAP).start();
    let resp = post(&node, "hello", false, None);
    assert_eq!(resp.status, 200, "{resp:?}");
    let (text, m) = metrics(&node);
    promtool_passes(&text);
    let policy = node.get("/healthz").json()["policy"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        sample(
            &m,
            "edgeroute_policy_failures_total",
            &[("policy", &policy), ("kind", "trap")]
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &m,
            "edgeroute_requests_total",
            &[("reason", "policy_failure"), ("status", "ok")]
        ),
        1.0,
        "{text}"
    );
    assert!(
        audit_lines(&node, 0).is_empty(),
        "a local answer is not egress"
    );
}

/// Sums of a `/ledger` snapshot, as the dashboard's big numbers show them.
fn ledger_totals(ledger: &Value) -> [u64; 3] {
    let buckets = ledger["buckets"].as_array().unwrap();
    let sum = |f: &dyn Fn(&Value) -> u64| buckets.iter().map(f).sum::<u64>();
    [
        sum(&|b| b["local"]["requests"].as_u64().unwrap()),
        sum(&|b| b["cloud"]["requests"].as_u64().unwrap()),
        sum(&|b| b["refused"].as_u64().unwrap()),
    ]
}

#[test]
fn the_dashboard_shows_the_ledger_in_a_real_browser_without_console_errors() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE.start(&cloud);
    let browser = Browser::start();
    browser.open(&format!("{}/dashboard?interval_ms=300", node.url()));
    browser.wait_for(
        "return document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );

    // A scripted burst: local, cloud and refused requests.
    for _ in 0..2 {
        post(&node, "hi there", false, None);
    }
    post(&node, &prompt("burst", 120), false, None);
    let refused = post(&node, &prompt("burst", 3000), false, Some("restricted"));
    assert_eq!(refused.status, 400, "{refused:?}");
    let ledger = node.get("/ledger").json();
    let [local, cloud_requests, refused] = ledger_totals(&ledger);
    assert_eq!((local, cloud_requests, refused), (2, 1, 1), "{ledger}");

    // The page catches up on its next polls.
    browser.wait_for(
        &format!(
            "return document.getElementById('total-local').textContent.trim() === '{local}' \
             && document.getElementById('total-cloud').textContent.trim() === '{cloud_requests}' \
             && document.getElementById('total-refused').textContent.trim() === '{refused}'"
        ),
        Duration::from_secs(30),
    );
    let spend =
        browser.eval("return document.getElementById('cloud-spend-usd').textContent.trim()");
    let expected = format!(
        "{:.6}",
        ledger["totals"]["cloud_cost_usd"].as_f64().unwrap()
    );
    assert_eq!(spend, json!(expected));
    let rows = browser.eval("return document.querySelectorAll('#buckets-body tr').length");
    assert_eq!(rows, json!(ledger["buckets"].as_array().unwrap().len()));
    let admin = browser.eval("return document.body.dataset.admin");
    assert_eq!(admin, json!("off"), "no admin token is set on this node");

    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard.png");
    std::fs::write(&shot, &png).unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());

    let console = browser.console();
    let bad: Vec<&Value> = console
        .iter()
        .filter(|e| matches!(e["level"].as_str(), Some("SEVERE" | "WARNING")))
        .collect();
    assert!(bad.is_empty(), "browser console: {bad:#?}");
}
