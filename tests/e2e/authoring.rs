//! Writing a policy as a newcomer would: `edgeroute policy new` for each
//! template language, its build script, then `policy check` and `policy
//! test` run from the project's own folder (not the repository: the
//! built-in config), the exact last line of both, a failing case's exit
//! status, the shipped policy's case file, and a C policy's log line in
//! the node's log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use edgeroute_testkit::{FakeCloud, REPO_ROOT, exclusive, unique};
use serde_json::json;

use crate::EDGEROUTE;
use crate::components::{POLICY_BANDIT, POLICY_DEFAULT};

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn last_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// `edgeroute ARGS` run in `dir`.
fn edgeroute(dir: &Path, args: &[&str]) -> Output {
    EDGEROUTE
        .command()
        .args(args)
        .current_dir(dir)
        .env_remove("EDGEROUTE_CONFIG")
        .output()
        .expect("run edgeroute")
}

/// A new project of `lang`, built; its folder. The C toolchain is the one
/// `components/policies/toolchains.sh` installs (clang, wasm-tools, the
/// project's wit-bindgen C generator).
fn built(lang: &str) -> PathBuf {
    let parent = std::env::temp_dir().join(unique("edgeroute-authoring"));
    std::fs::create_dir_all(&parent).unwrap();
    let name = format!("demo-{lang}");
    let out = edgeroute(&parent, &["policy", "new", &name, "--lang", lang]);
    assert!(out.status.success(), "{}", text(&out));
    let project = parent.join(&name);
    // The toolchains the repository's own policies build with
    // (components/policies/toolchains.sh: pip, npm, apt, cargo).
    let tools = format!("source {REPO_ROOT}/components/policies/toolchains.sh");
    let script = match lang {
        "c" | "zig" => format!(
            "{tools} && ensure_c_tools >&2 && ensure_python_tools >&2 && \
             WIT_BINDGEN_C=\"$WIT_BINDGEN_C\" CLANG=\"$CLANG\" WASM_TOOLS=\"$WASM_TOOLS\" ZIG=\"$ZIG\" bash build.sh"
        ),
        "python" => format!(
            "{tools} && ensure_python_tools >&2 && \
             COMPONENTIZE_PY=\"$COMPONENTIZE_PY\" WASM_TOOLS=\"$WASM_TOOLS\" bash build.sh"
        ),
        "js" => format!("{tools} && ensure_js_tools >&2 && JCO=\"$JCO\" bash build.sh"),
        // Its own target folder: the suite's is locked by the cargo that
        // runs this test.
        _ => "CARGO_TARGET_DIR=\"$HOME/.cache/edgeroute-toolchains/policy-template-target\" bash build.sh"
            .to_string(),
    };
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(&project)
        .output()
        .unwrap();
    assert!(out.status.success(), "{lang} build: {}", text(&out));
    assert!(project.join("policy.wasm").is_file());
    project
}

fn c_project() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| built("c"))
}

#[test]
fn every_template_builds_and_passes_check_and_its_cases_from_its_own_folder() {
    // Python and JavaScript policies take seconds of both cores to load:
    // not beside another test's node.
    let _machine = exclusive();
    for (lang, project) in [
        ("c", c_project().to_path_buf()),
        ("rust", built("rust")),
        ("zig", built("zig")),
        ("python", built("python")),
        ("js", built("js")),
    ] {
        let check = edgeroute(&project, &["policy", "check", "policy.wasm"]);
        assert!(check.status.success(), "{lang}: {}", text(&check));
        assert_eq!(
            last_line(&check),
            "4 passed, 0 failed",
            "{lang}: {}",
            text(&check)
        );

        let test = edgeroute(&project, &["policy", "test", "policy.wasm", "cases.jsonl"]);
        assert!(test.status.success(), "{lang}: {}", text(&test));
        assert_eq!(
            last_line(&test),
            "5 passed, 0 failed",
            "{lang}: {}",
            text(&test)
        );

        // For the Spin gateway: every template imports `host`, which
        // scripts/spin-policy.sh composes in; the result is still a policy
        // the node accepts, and it decides the same.
        let out = Command::new("bash")
            .arg(Path::new(REPO_ROOT).join("scripts/spin-policy.sh"))
            .args(["policy.wasm", "policy-spin.wasm"])
            .current_dir(&project)
            .output()
            .unwrap();
        assert!(out.status.success(), "{lang}: {}", text(&out));
        assert!(text(&out).contains("composed in"), "{lang}: {}", text(&out));
        for args in [
            &["policy", "check", "policy-spin.wasm"][..],
            &["policy", "test", "policy-spin.wasm", "cases.jsonl"],
        ] {
            let out = edgeroute(&project, args);
            assert!(out.status.success(), "{lang} {args:?}: {}", text(&out));
        }

        // A case the policy does not meet: exit status 1, the same count.
        let wrong = project.join("wrong.jsonl");
        let mut cases = std::fs::read_to_string(project.join("cases.jsonl")).unwrap();
        cases.push_str(
            &json!({"name": "wrongly expected", "features": {"prompt_tokens": 20}, "expect": {"decision": "cloud:frontier"}})
                .to_string(),
        );
        std::fs::write(&wrong, cases).unwrap();
        let test = edgeroute(&project, &["policy", "test", "policy.wasm", "wrong.jsonl"]);
        assert_eq!(test.status.code(), Some(1), "{lang}: {}", text(&test));
        assert_eq!(
            last_line(&test),
            "5 passed, 1 failed",
            "{lang}: {}",
            text(&test)
        );
        assert!(
            text(&test).contains(
                "FAIL wrongly expected: expected decision cloud:frontier, got local:smollm2"
            ),
            "{}",
            text(&test)
        );
    }

    // The shipped policies have their own case files; the bandit's learns
    // from outcomes of its own decisions, case after case.
    for (policy, cases) in [
        (POLICY_DEFAULT, "components/policy-default/cases.jsonl"),
        (POLICY_BANDIT, "components/policy-bandit/cases.jsonl"),
    ] {
        let cases = Path::new(REPO_ROOT).join(cases);
        let out = edgeroute(
            &std::env::temp_dir(),
            &["policy", "test", policy, cases.to_str().unwrap()],
        );
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            last_line(&out).ends_with("passed, 0 failed"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn a_c_policy_logs_into_the_node_log_with_its_id() {
    let cloud = FakeCloud::start();
    let node = EDGEROUTE
        .node(&cloud)
        .policy_component(c_project().join("policy.wasm"))
        .env("EDGEROUTE_LOG", "info,policy=debug")
        .start();
    let resp = node.post_json(
        "/v1/chat/completions",
        json!({"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        &[],
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    let id = node.get("/healthz").json()["policy"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = node.logs_with("routed a prompt at");
    // The test config's parameter reached the C code, and its line came
    // back through `host.log`, tagged with the version.
    let configured = logs
        .lines()
        .find(|l| l.contains("configured: local_max_prompt_tokens=64"))
        .unwrap_or_else(|| panic!("no configure line in:\n{logs}"));
    assert!(configured.contains(&format!("policy={id}")), "{configured}");
    assert!(
        logs.contains("routed a prompt at (ms since the epoch) 1"),
        "the route line, with the node's clock: {logs}"
    );
}
