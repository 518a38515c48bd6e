//! The reference routing policy written in Python (componentize-py),
//! JavaScript (jco / componentize-js) and C (`wit-bindgen c` + clang +
//! `wasm-tools component new`), built from source by
//! `components/policies/build-all.sh`, must route real requests exactly as
//! the Rust reference policy (the embedded default) does: same target, same
//! `x-edgeroute-reason`, and restricted data never reaching the cloud.
//!
//! The build installs what is missing (pip, npm, cargo, apt) under
//! ~/.cache/edgeroute-toolchains; the first run takes a few minutes, later
//! ones about half a minute.
//!
//! Every node and policy check here runs under `exclusive()`: a Python or
//! JavaScript policy takes seconds of both cores to load and must still
//! answer `configure` within the 2 s start budget and every `route` within
//! the 20 ms deadline, which it can miss
//! beside another test's node (or another of these checks).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use edgeroute_testkit::{FakeCloud, LOCAL_MODEL, Node, REPO_ROOT, UPSTREAM, exclusive};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::POLICY_DEFAULT;

/// Languages built by build-all.sh, as in its file names `policy_LANG.wasm`.
const LANGUAGES: [&str; 3] = ["python", "js", "c"];

/// In a test's own prompt, so the fake cloud can tell whether it leaked.
const CANARY: &str = "canary-policy-languages-restricted";

/// The components, built once per test run.
fn components_dir() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-languages");
        let script = Path::new(REPO_ROOT).join("components/policies/build-all.sh");
        let started = Instant::now();
        let output = Command::new("bash")
            .arg(&script)
            .arg(&out)
            .current_dir(REPO_ROOT)
            .output()
            .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            return Err(format!(
                "{} {} failed ({}):\n{text}",
                script.display(),
                out.display(),
                output.status
            ));
        }
        eprintln!(
            "[policy_languages] built in {:.1?}:\n{text}",
            started.elapsed()
        );
        Ok(out)
    });
    match built {
        Ok(dir) => dir,
        Err(message) => panic!("{message}"),
    }
}

/// A port's component (`python`, `js`, `c`), built once per test run.
pub(crate) fn component(language: &str) -> PathBuf {
    components_dir().join(format!("policy_{language}.wasm"))
}

/// One request of the table, and the target the reference policy gives it
/// under the test config (`local_max_prompt_tokens = 64`, restricted never
/// leaves).
struct Case {
    name: &'static str,
    prompt: String,
    sensitivity: Option<&'static str>,
    target: String,
    /// How the reference policy's reason starts and ends (the middle is
    /// the prompt's token count).
    reason: (&'static str, &'static str),
}

fn long_prompt(topic: &str) -> String {
    // ~200 tokens: well past the test config's 64-token threshold.
    format!(
        "Summarize the following notes about {topic} in one sentence. {}",
        "The committee met on Tuesday to review the quarterly figures and the plan for next year. "
            .repeat(10)
    )
}

fn cases() -> Vec<Case> {
    let local = format!("local:{LOCAL_MODEL}");
    let cloud = format!("cloud:{UPSTREAM}");
    vec![
        Case {
            name: "short public",
            prompt: "Say hello in one word.".into(),
            sensitivity: None,
            target: local.clone(),
            reason: ("short prompt (", " <= 64 tokens): local"),
        },
        Case {
            name: "long public",
            prompt: long_prompt("the budget"),
            sensitivity: None,
            target: cloud.clone(),
            reason: ("long prompt (", " > 64 tokens): cloud"),
        },
        Case {
            name: "long internal (may leave)",
            prompt: long_prompt("the roadmap"),
            sensitivity: Some("internal"),
            target: cloud,
            reason: ("long prompt (", " > 64 tokens): cloud"),
        },
        Case {
            name: "short restricted",
            prompt: format!("Say hello to {CANARY} in one word."),
            sensitivity: Some("restricted"),
            target: local.clone(),
            reason: ("sensitive: stays local", ""),
        },
        Case {
            name: "long restricted",
            prompt: format!("{} Mention {CANARY}.", long_prompt("salaries")),
            sensitivity: Some("restricted"),
            target: local,
            reason: ("sensitive: stays local", ""),
        },
    ]
}

/// What a node answered: status, target and reason, per case.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    target: Option<String>,
    reason: Option<String>,
}

fn ask(node: &Node, case: &Case) -> Answer {
    let body: Value = json!({
        "model": "auto",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": case.prompt}],
    });
    let mut headers = Vec::new();
    if let Some(level) = case.sensitivity {
        headers.push(("x-edgeroute-sensitivity", level));
    }
    let resp = node.post_chat(body, &headers);
    Answer {
        status: resp.status,
        target: resp.target().map(str::to_owned),
        reason: resp.decision_reason(),
    }
}

/// Start a node with `policy` (None: the embedded Rust reference) and put
/// every case to it. Checks what must hold whatever the policy's language.
fn run_cases(policy: Option<&Path>) -> Vec<Answer> {
    let label = policy.map_or("rust (embedded default)".to_owned(), |p| {
        p.display().to_string()
    });
    let _alone = exclusive();
    let cloud = FakeCloud::start();
    let mut builder = EDGEROUTE.node(&cloud).local_max_prompt_tokens(64);
    if let Some(path) = policy {
        builder = builder.policy_component(path);
    }
    let started = Instant::now();
    let node = builder.start();
    eprintln!(
        "[policy_languages] {label}: node up in {:.1?}",
        started.elapsed()
    );

    let answers: Vec<Answer> = cases()
        .iter()
        .map(|case| {
            let answer = ask(&node, case);
            assert_eq!(
                answer.status,
                200,
                "{label}, {}: {answer:?}\n--- node output ---\n{}",
                case.name,
                node.logs()
            );
            assert_eq!(
                answer.target.as_deref(),
                Some(case.target.as_str()),
                "{label}, {}: {answer:?}",
                case.name
            );
            answer
        })
        .collect();

    assert!(
        cloud.requests_mentioning(CANARY).is_empty(),
        "{label}: restricted data reached the cloud\n{}",
        cloud.describe()
    );
    let to_cloud = cases()
        .iter()
        .filter(|c| c.target.starts_with("cloud:"))
        .count();
    assert_eq!(
        cloud.chat_requests().len(),
        to_cloud,
        "{label}: {}",
        cloud.describe()
    );
    answers
}

/// The Rust reference policy's answers, once per test run.
fn reference() -> &'static [Answer] {
    static REFERENCE: OnceLock<Vec<Answer>> = OnceLock::new();
    REFERENCE.get_or_init(|| run_cases(None))
}

fn matches_reference(language: &str) {
    let path = component(language);
    let answers = run_cases(Some(&path));
    let expected = reference();
    for ((case, got), want) in cases().iter().zip(&answers).zip(expected) {
        assert_eq!(
            got, want,
            "{language}, {}: the {language} policy answered differently from the Rust reference",
            case.name
        );
    }
    // And the reasons are the reference policy's own words.
    for (case, answer) in cases().iter().zip(expected) {
        let reason = answer.reason.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with(case.reason.0) && reason.ends_with(case.reason.1),
            "{}: reference reason {reason:?}",
            case.name
        );
    }
}

#[test]
fn python_policy_routes_like_the_reference() {
    matches_reference("python");
}

#[test]
fn js_policy_routes_like_the_reference() {
    matches_reference("js");
}

#[test]
fn c_policy_routes_like_the_reference() {
    matches_reference("c");
}

/// `edgeroute policy check --reference` (world, imports, probe, the
/// conformance properties and the reference decision table) passes for
/// every language.
#[test]
fn every_language_passes_policy_check() {
    for language in LANGUAGES {
        let path = component(language);
        let _alone = exclusive();
        let started = Instant::now();
        let (passed, text) = EDGEROUTE.policy_check(&path, true);
        eprintln!(
            "[policy_languages] policy check {language} ({:.1?}):\n{text}",
            started.elapsed()
        );
        assert!(
            passed,
            "edgeroute policy check --reference {} failed:\n{text}",
            path.display()
        );
        assert!(text.contains(" 0 failed"), "{text}");
        // The reference table as cases (`edgeroute policy test`).
        let cases = Path::new(REPO_ROOT).join("components/policies/cases.jsonl");
        let out = EDGEROUTE
            .command()
            .args(["policy", "test"])
            .arg(&path)
            .arg(&cases)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{language}: {said}");
        assert_eq!(said.lines().last(), Some("6 passed, 0 failed"), "{said}");
    }
}

/// All four languages hot-swapped, one after another, into one running node
/// through the admin API (`edgeroute policy swap`), each answering like the
/// reference as soon as it is active.
#[test]
fn every_language_hot_swaps_into_a_running_node() {
    let expected = reference().to_vec();
    // Built (or waited for) before taking the machine: the build needs no
    // exclusivity, and other tests' nodes may run meanwhile.
    let rust = PathBuf::from(POLICY_DEFAULT);
    let order: Vec<(String, PathBuf)> = LANGUAGES
        .iter()
        .map(|l| (l.to_string(), component(l)))
        .chain([("rust".to_string(), rust)])
        .collect();
    let _alone = exclusive();
    let cloud = FakeCloud::start();
    let token = "policy-languages-admin";
    let node = EDGEROUTE
        .node(&cloud)
        .local_max_prompt_tokens(64)
        .env("EDGEROUTE_ADMIN_TOKEN", token)
        .start();
    for (language, path) in order {
        let started = Instant::now();
        let output = EDGEROUTE
            .command()
            .args(["policy", "swap", "--node", &node.url(), "--token", token])
            .arg(&path)
            .output()
            .expect("run edgeroute policy swap");
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "swap to {language} failed:\n{text}\n{}",
            node.logs()
        );
        let swapped: Value = serde_json::from_str(&String::from_utf8_lossy(&output.stdout))
            .expect("swap prints JSON");
        let id = swapped["active"]["id"]
            .as_str()
            .expect("active id")
            .to_string();
        eprintln!(
            "[policy_languages] hot swap to {language}: {:.1?}",
            started.elapsed()
        );
        for (case, want) in cases().iter().zip(&expected) {
            let got = ask(&node, case);
            assert_eq!(&got, want, "{language} after a hot swap, {}", case.name);
        }
        let resp = node.post_chat(json!({"model": "auto", "max_tokens": 1, "messages": [{"role": "user", "content": long_prompt("id check")}]}), &[]);
        assert_eq!(
            resp.header("x-edgeroute-policy"),
            Some(id.as_str()),
            "{language}: {resp:?}"
        );
    }
    cloud.assert_received(CANARY, 0);
}
