//! Spin apps on the node: the sample app (`examples/spin-sample`) under the
//! real `spin up`, its `llm::infer` and `llm::generate_embeddings` served
//! by the node over both of Spin's `remote_http` protocols, its bearer token
//! a client key whose tenant decides what may leave.
//!
//! The Spin CLI is `$SPIN`, else `spin` on `PATH`, else the 4.0.2 build in
//! `../shared/tools/spin/` (or `$EDGEROUTE_SPIN_ARCHIVE`), unpacked into the
//! test's target folder and checked against its sha256. Without any of
//! them the Spin binary cannot run here: the test says so and stops.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use edgeroute_testkit::{CLOUD_REPLY, FakeCloud, REPO_ROOT, unique};
use serde_json::Value;

use crate::EDGEROUTE;

const SPIN_SHA256: &str = "def379f2066e066eac15c8ec834bb56ab9c03f5721016529c0c520da9003531e";
const SAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/spin-sample");

/// The Spin CLI, or why there is none.
fn spin() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SPIN").filter(|p| !p.is_empty()) {
        return Ok(path.into());
    }
    if Command::new("spin")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok("spin".into());
    }
    let unpacked = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spin-4.0.2");
    if !unpacked.is_file() {
        let archive = std::env::var("EDGEROUTE_SPIN_ARCHIVE").unwrap_or_else(|_| {
            format!("{REPO_ROOT}/../shared/tools/spin/spin-4.0.2-x86_64-linux.gz")
        });
        if !Path::new(&archive).is_file() {
            return Err(format!(
                "no Spin CLI: $SPIN is unset, `spin` is not on PATH and {archive} does not exist"
            ));
        }
        let partial = unpacked.with_extension("partial");
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "gzip -dc '{archive}' > '{}' && chmod +x '{}'",
                partial.display(),
                partial.display()
            ))
            .status()
            .map_err(|e| e.to_string())?;
        assert!(status.success(), "unpacking {archive} failed");
        let sum = Command::new("sha256sum").arg(&partial).output().unwrap();
        let sum = String::from_utf8_lossy(&sum.stdout);
        assert!(
            sum.starts_with(SPIN_SHA256),
            "{archive} unpacks to sha256 {sum}, expected {SPIN_SHA256}"
        );
        std::fs::rename(&partial, &unpacked).unwrap();
    }
    Ok(unpacked)
}

/// The Spin CLI; without one the test says it skips, and why (never
/// silently).
pub(crate) fn spin_or_skip(test: &str) -> Option<PathBuf> {
    spin()
        .inspect_err(|why| eprintln!("SKIPPED {test}: {why}"))
        .ok()
}

/// `spin build` of the sample, once per test run. Its own target folder:
/// the one `cargo test` uses is locked while the tests run.
fn build_sample(spin: &Path) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spin-sample-target");
        let out = Command::new(spin)
            .args(["build", "-f", &format!("{SAMPLE}/spin.toml")])
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .expect("run spin build");
        assert!(
            out.status.success(),
            "spin build failed\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// A running `spin up` of the sample; stopped (its whole process group:
/// `spin up` runs the app in a child) when dropped.
pub(crate) struct SpinApp {
    child: Child,
    url: String,
    state: tempfile::TempDir,
}

impl SpinApp {
    fn up(spin: &Path, node_url: &str, key: &str, api_type: &str) -> SpinApp {
        let api = if api_type == "default" {
            String::new()
        } else {
            format!("api_type = \"{api_type}\"\n")
        };
        let config = format!(
            "[llm_compute]\ntype = \"remote_http\"\nurl = \"{node_url}\"\nauth_token = \"{key}\"\n{api}"
        );
        SpinApp::launch(
            spin,
            Path::new(&format!("{SAMPLE}/spin.toml")),
            &config,
            &[],
            &[],
        )
    }

    /// `spin up -f manifest` on a free port, with `runtime_config` (its
    /// text), `env` (`SPIN_VARIABLE_*`) and more `flags`, once it says it
    /// is serving.
    pub(crate) fn launch(
        spin: &Path,
        manifest: &Path,
        runtime_config: &str,
        env: &[(&str, String)],
        flags: &[&str],
    ) -> SpinApp {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("spin-state")
            .tempdir()
            .unwrap();
        let state = dir.path().to_path_buf();
        let config = state.join("runtime-config.toml");
        std::fs::write(&config, runtime_config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(spin)
            .args(["up", "-f"])
            .arg(manifest)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .arg("--runtime-config-file")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--disable-cache")
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn spin up");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with("Serving http://") => break,
                Ok(_) => {}
                Err(_) => panic!("spin up did not print `Serving http://` within 60 s"),
            }
        }
        SpinApp {
            child,
            url: format!("http://127.0.0.1:{port}"),
            state: dir,
        }
    }

    /// What the app's components wrote to stderr so far (Spin keeps it
    /// in the state folder's `logs`).
    pub(crate) fn stderr(&self) -> String {
        let logs = self.state.path().join("logs");
        let mut text = String::new();
        for entry in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.to_string_lossy().ends_with("_stderr.txt") {
                text += &std::fs::read_to_string(&path).unwrap_or_default();
            }
        }
        text
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// POST to the app; the status and the JSON body.
    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let mut resp = agent
            .post(format!("{}{path}", self.url))
            .send(body)
            .unwrap_or_else(|e| panic!("POST {path} to the Spin app: {e}"));
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }
}

impl Drop for SpinApp {
    fn drop(&mut self) {
        // `--`: a negative pid (the process group) is not an option.
        let _ = Command::new("kill")
            .args(["-s", "TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // `--`: a negative pid (the process group) is not an option.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// Over 64 tokens, so the default policy sends it to the cloud when it may.
pub(crate) fn long_prompt(canary: &str) -> String {
    format!(
        "Reference {canary}. Summarise in one line: {}",
        ["the depot's weekly deliveries grew while fuel costs and driver shortages weighed on the regional schedule"; 4].join("; ")
    )
}

#[test]
fn a_spin_apps_llm_calls_are_served_by_the_node_under_both_protocols() {
    let Some(spin) =
        spin_or_skip("a_spin_apps_llm_calls_are_served_by_the_node_under_both_protocols")
    else {
        return;
    };
    build_sample(&spin);
    let cloud = FakeCloud::start();
    let (app_key, clinic_key) = ("spin-app-key-1", "spin-clinic-key-2");
    let node = EDGEROUTE
        .node(&cloud)
        .env("SPIN_APP_KEYS", app_key)
        .env("SPIN_CLINIC_KEYS", clinic_key)
        .config_extra(
            "[spin]\nmodels = { \"llama2-chat\" = \"auto\", \"all-minilm-l6-v2\" = \"minilm\" }\n\
             [tenants.app]\nkeys_env = \"SPIN_APP_KEYS\"\n\
             [tenants.clinic]\nkeys_env = \"SPIN_CLINIC_KEYS\"\nsensitivity = \"restricted\"\n",
        )
        .start();

    for api_type in ["default", "open_ai"] {
        let app = SpinApp::up(&spin, &node.url(), app_key, api_type);
        // A short prompt: the local model answers, with Spin's token counts.
        let (status, answer) = app.post("/infer?max_tokens=8", "Name a colour.");
        assert_eq!(status, 200, "{api_type}: {answer}");
        assert!(
            answer["text"]
                .as_str()
                .is_some_and(|t| !t.trim().is_empty()),
            "{api_type}: {answer}"
        );
        assert!(
            answer["prompt_tokens"].as_u64().unwrap() > 0,
            "{api_type}: {answer}"
        );
        assert!(
            (1..=8).contains(&answer["generated_tokens"].as_u64().unwrap()),
            "{api_type}: {answer}"
        );
        // Embeddings: the node's MiniLM under Spin's model name.
        let (status, embedded) = app.post("/embed", "first line\nsecond line");
        assert_eq!(status, 200, "{api_type}: {embedded}");
        assert_eq!(embedded["count"], 2, "{api_type}: {embedded}");
        assert_eq!(embedded["dims"], 384, "{api_type}: {embedded}");
        // A public long prompt goes to the cloud, once.
        let canary = unique(&format!("spin-{api_type}"));
        let (status, answer) = app.post("/infer?max_tokens=8", &long_prompt(&canary));
        assert_eq!(status, 200, "{api_type}: {answer}");
        assert_eq!(answer["text"], CLOUD_REPLY, "{api_type}: {answer}");
        cloud.assert_received(&canary, 1);
    }

    // The clinic's app changes nothing in its code: its key's tenant is
    // restricted, so the same long prompt stays on the node.
    let clinic = SpinApp::up(&spin, &node.url(), clinic_key, "default");
    let canary = unique("spin-clinic");
    let (status, answer) = clinic.post("/infer?max_tokens=8", &long_prompt(&canary));
    assert_eq!(status, 200, "{answer}");
    assert_ne!(answer["text"], CLOUD_REPLY, "{answer}");
    cloud.assert_received(&canary, 0);

    // A wrong key: Spin's default protocol cannot carry the node's error,
    // so the app sees an error, not an answer.
    let stranger = SpinApp::up(&spin, &node.url(), "not-a-key", "default");
    let canary = unique("spin-stranger");
    let (status, answer) = stranger.post("/infer", &long_prompt(&canary));
    assert_eq!(status, 502, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("RuntimeError"),
        "{answer}"
    );
    cloud.assert_received(&canary, 0);
}
