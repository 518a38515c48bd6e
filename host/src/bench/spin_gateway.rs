//! What Spin adds in front of a node, under the real `spin up`, from the
//! same pooled client in the same run:
//!
//! - the gateway (`spin.toml` at the root): a chat request sent to the
//!   node directly, and through the gateway (Spin's HTTP trigger, an
//!   instance of the gateway and the policy, detection, the guard, Spin's
//!   outbound HTTP to the node) which places it locally; non-streaming
//!   latency, and a stream's first byte and end; with Spin's own instance
//!   reuse, with `runtime-config/spin-up.args`, and with those flags and
//!   the TCP_NODELAY shim (`target-wasm/spin-nodelay.so`) preloaded; and a
//!   request the gateway places in the cloud (a loopback upstream) against
//!   the same body sent to that upstream directly;
//! - a Spin app's `llm::infer` (`examples/spin-sample`, when built): its
//!   `/infer` against the node's own chat endpoint with the same prompt.
//!
//! The node is in this process and serves from the paced test backend at a
//! speed where its own time is a few microseconds, so what is measured is
//! Spin's and the gateway's part, not the model's. Needs the Spin CLI
//! (`$SPIN`, else `spin` on the PATH) and `spin build` run at the root (and
//! in `examples/spin-sample` for the second part).

use super::Spread;
use super::proxy::{report_steps, send as post, send_timed, serve_on};
use crate::config::Config;
use crate::nn::Pace;
use crate::node::Node;
use anyhow::{Context, bail};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fast enough that a one-token answer takes microseconds.
const INSTANT_MODEL: Pace = Pace {
    prefill_tokens_per_s: 1e9,
    decode_tokens_per_s: 1e9,
};

/// A `spin up`, stopped with its process group when dropped.
struct SpinUp {
    child: Child,
    url: String,
}

impl SpinUp {
    fn start(
        spin: &Path,
        manifest: &Path,
        runtime_config: &Path,
        env: &[(&str, String)],
        flags: &[String],
    ) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = Command::new(spin)
            .args(["up", "-f"])
            .arg(manifest)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--runtime-config-file")
            .arg(runtime_config)
            .args(flags)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("running {}", spin.display()))?;
        let stdout = child.stdout.take().context("spin up's stdout")?;
        let mut up = SpinUp {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.starts_with("Serving http://") => return Ok(up),
                Ok(_) => {}
                Err(_) => {
                    up.stop();
                    bail!(
                        "spin up -f {} did not start serving within 90 s",
                        manifest.display()
                    );
                }
            }
        }
    }

    fn stop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-s", "TERM", "--", &group])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for SpinUp {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The Spin CLI: `$SPIN`, else `spin` on the PATH.
fn spin_cli() -> anyhow::Result<PathBuf> {
    if let Some(spin) = std::env::var_os("SPIN").filter(|s| !s.is_empty()) {
        return Ok(spin.into());
    }
    if Command::new("spin")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok("spin".into());
    }
    bail!(
        "no Spin CLI: set SPIN to it or put `spin` on the PATH \
         (./dev spin unpacks Spin 4.0.2 to $CARGO_TARGET_DIR/spin-4.0.2)"
    )
}

/// The flags in `runtime-config/spin-up.args` (`#` starts a comment line).
fn spin_up_flags(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(String::from)
        .collect())
}

fn built(path: &Path, how: &str) -> anyhow::Result<()> {
    if path.is_file() {
        Ok(())
    } else {
        bail!("{} is not built: {how}", path.display())
    }
}

/// What `requests` pairs of calls gave, `a` then `b` each time: the time
/// to the first body byte and to the end of each answer, and the
/// `Server-Timing` headers of each side's answers.
struct Pairs {
    first: (Vec<Duration>, Vec<Duration>),
    whole: (Vec<Duration>, Vec<Duration>),
    steps: (Vec<String>, Vec<String>),
}

/// `requests` pairs, alternating `a` and `b` after a warm-up.
async fn pairs(
    client: &reqwest::Client,
    (a, a_body): (&str, &str),
    (b, b_body): (&str, &str),
    requests: u32,
) -> anyhow::Result<Pairs> {
    for _ in 0..20 {
        post(client, a, a_body.to_string()).await?;
        post(client, b, b_body.to_string()).await?;
    }
    let mut pairs = Pairs {
        first: Default::default(),
        whole: Default::default(),
        steps: Default::default(),
    };
    for _ in 0..requests {
        let (first, whole, timing) = send_timed(client, a, a_body.to_string()).await?;
        pairs.first.0.push(first);
        pairs.whole.0.push(whole);
        pairs.steps.0.extend(timing);
        let (first, whole, timing) = send_timed(client, b, b_body.to_string()).await?;
        pairs.first.1.push(first);
        pairs.whole.1.push(whole);
        pairs.steps.1.extend(timing);
    }
    Ok(pairs)
}

/// A delay of this much or more is a stall (a 40 ms delayed ACK), not work.
const STALL: Duration = Duration::from_millis(20);

fn report(what: &str, (direct, through): (Vec<Duration>, Vec<Duration>), via: &str) {
    report_against(what, (direct, through), "node directly", via)
}

/// [`report`] with the baseline named.
fn report_against(
    what: &str,
    (direct, through): (Vec<Duration>, Vec<Duration>),
    baseline: &str,
    via: &str,
) {
    let stalls = |v: &[Duration]| v.iter().filter(|d| **d >= STALL).count();
    let (direct_stalls, through_stalls) = (stalls(&direct), stalls(&through));
    let n = through.len();
    let (direct, through) = (Spread::of(direct), Spread::of(through));
    println!(
        "  {what}: {baseline} p50 {:.0} µs, p99 {:.0} µs; {via} p50 {:.0} µs, p99 {:.0} µs; added p50 {:.0} µs, p99 {:.0} µs; stalls of 20 ms or more: {direct_stalls} {baseline}, {through_stalls} {via} (of {n} each)",
        direct.p50,
        direct.p99,
        through.p50,
        through.p99,
        through.p50 - direct.p50,
        through.p99 - direct.p99
    );
}

pub async fn run(mut config: Config, requests: u32) -> anyhow::Result<()> {
    if requests == 0 {
        bail!("--spin-requests must be at least 1");
    }
    let spin = spin_cli()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    built(
        &root.join("target-wasm/spin_gateway.wasm"),
        "run `spin build` at the repository root",
    )?;
    config.local.test_backend = Some(INSTANT_MODEL);
    config.local.embedding = None;
    config
        .spin
        .models
        .insert("llama2-chat".into(), "auto".into());
    let local = config
        .local
        .models
        .first()
        .context("the config has no local model")?
        .name
        .clone();
    let node = Node::start(config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let node_url = format!("http://{}", listener.local_addr()?);
    serve_on(listener, &node, std::future::pending());

    let runtime_config = root.join("runtime-config/spin-runtime-config.toml");
    let flags_file = root.join("runtime-config/spin-up.args");
    let flags = spin_up_flags(&flags_file)?;
    let client = reqwest::Client::new();
    let chat = |stream: bool| {
        json!({"model": "auto", "max_tokens": 1, "stream": stream,
               "messages": [{"role": "user", "content": "What is the weather in Lyon?"}]})
        .to_string()
    };
    println!(
        "what Spin adds in front of the node: {requests} requests each way, alternating, one pooled client; the node in this process on the paced TEST backend at 1e9 tokens/s (1 token), the gateway under `spin up`"
    );
    let direct = format!("{node_url}/v1/chat/completions");
    // The cloud the gateway calls itself: a loopback upstream that answers
    // at once and, like most servers, acknowledges a request's headers
    // only with its answer (it does not re-arm TCP_QUICKACK as the node
    // does). A prompt over the policy's 512 tokens (the gateway counts
    // bytes / 4) is placed there; the baseline is the same body sent to
    // the upstream directly.
    let upstream = super::upstream::start(super::upstream::Timing {
        round_trip: Duration::ZERO,
        server_ttft: Duration::ZERO,
        tokens_per_s: 1e9,
    })
    .await?;
    let upstream_url = format!("{}/chat/completions", upstream.base_url);
    let upstream_origin = upstream.base_url.trim_end_matches("/v1").to_string();
    let cities = [
        "Lyon", "Oslo", "Lima", "Pune", "Kyoto", "Accra", "Quito", "Perth",
    ];
    let long: String = (0..100)
        .map(|i| format!("Is it raining in {} on day {i}? ", cities[i % cities.len()]))
        .collect();
    let cloud_body = json!({"model": "auto", "max_tokens": 1,
        "messages": [{"role": "user", "content": long}]})
    .to_string();
    // Spin's own instance reuse first (a fresh instance every 128
    // requests), then the flags `./dev spin` runs the gateway with, then
    // those flags and the TCP_NODELAY shim `./dev spin` preloads (built by
    // `spin build`; scripts/spin-nodelay.c says why).
    let shim = root.join("target-wasm/spin-nodelay.so");
    let args = format!("runtime-config/spin-up.args ({})", flags.join(" "));
    let mut ways = vec![
        (
            "Spin's default instance reuse".to_string(),
            Vec::new(),
            None,
        ),
        (args.clone(), flags.clone(), None),
    ];
    if shim.is_file() {
        let how =
            format!("{args} and target-wasm/spin-nodelay.so preloaded (as ./dev spin runs it)");
        ways.push((how, flags, Some(shim.display().to_string())));
    } else {
        println!(
            " (the gateway with the TCP_NODELAY shim: skipped, {} is not built: `spin build` at the root)",
            shim.display()
        );
    }
    for (how, flags, preload) in ways {
        println!(" the gateway with {how}");
        let mut env = vec![
            ("SPIN_VARIABLE_NODE_URL", node_url.clone()),
            ("SPIN_VARIABLE_LOCAL_MODELS", local.clone()),
            ("SPIN_VARIABLE_UPSTREAM_URL", upstream_url.clone()),
            ("SPIN_VARIABLE_UPSTREAM_ORIGIN", upstream_origin.clone()),
        ];
        env.extend(preload.map(|shim| ("LD_PRELOAD", shim)));
        let gateway = tokio::task::block_in_place(|| {
            SpinUp::start(
                &spin,
                &root.join("spin.toml"),
                &runtime_config,
                &env,
                &flags,
            )
        })?;
        let through = format!("{}/v1/chat/completions", gateway.url);
        for stream in [false, true] {
            let body = chat(stream);
            let pairs = pairs(&client, (&direct, &body), (&through, &body), requests).await?;
            if stream {
                report(
                    "streaming, time to first byte",
                    pairs.first,
                    "through the Spin gateway",
                );
                report(
                    "streaming, the whole answer",
                    pairs.whole,
                    "through the Spin gateway",
                );
            } else {
                report(
                    "non-streaming, whole answer",
                    pairs.whole,
                    "through the Spin gateway",
                );
            }
            report_steps("the node's (directly)", &pairs.steps.0);
            report_steps("the gateway's", &pairs.steps.1);
        }
        // The placement is real: the gateway's answer names the cloud.
        let probe = client
            .post(&through)
            .header("content-type", "application/json")
            .body(cloud_body.clone())
            .send()
            .await?;
        let header = |name: &str| {
            let value = probe.headers().get(name).and_then(|v| v.to_str().ok());
            value.unwrap_or_default().to_string()
        };
        let (target, reason) = (header("x-edgeroute-target"), header("x-edgeroute-reason"));
        if !target.starts_with("cloud") {
            bail!("the gateway placed the long prompt at '{target}', not in the cloud ({reason})");
        }
        let direct_cloud = (upstream_url.as_str(), cloud_body.as_str());
        let pairs = pairs(&client, direct_cloud, (&through, &cloud_body), requests).await?;
        report_against(
            "placed in the cloud, whole answer",
            pairs.whole,
            "the upstream directly",
            "through the Spin gateway",
        );
        report_steps("the gateway's", &pairs.steps.1);
    }

    let sample = root.join("examples/spin-sample");
    if built(&sample.join("target-wasm/spin_sample.wasm"), "").is_err() {
        println!(
            "  (a Spin app's llm::infer: skipped, examples/spin-sample is not built: `spin build` there)"
        );
        return Ok(());
    }
    let config =
        std::env::temp_dir().join(format!("edgeroute-bench-spin-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[llm_compute]\ntype = \"remote_http\"\nurl = \"{node_url}\"\nauth_token = \"any\"\napi_type = \"open_ai\"\n"
        ),
    )?;
    let app = tokio::task::block_in_place(|| {
        SpinUp::start(&spin, &sample.join("spin.toml"), &config, &[], &[])
    });
    let _ = std::fs::remove_file(&config);
    let app = app?;
    let prompt = "What is the weather in Lyon?";
    let body = json!({"model": "auto", "max_tokens": 1, "temperature": 0.0,
                      "messages": [{"role": "user", "content": prompt}]})
    .to_string();
    let infer = format!("{}/infer?max_tokens=1", app.url);
    let pairs = pairs(&client, (&direct, &body), (&infer, prompt), requests).await?;
    report(
        "a Spin app's llm::infer (open_ai protocol), whole answer",
        pairs.whole,
        "through the app",
    );
    Ok(())
}
