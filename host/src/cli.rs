//! `edgeroute policy …`: check a component offline with the code a node
//! runs at swap time, or manage the policy of a running node over its
//! admin API.

use crate::config::Config;
use crate::policy;
use crate::policy::eval::conformance::{self, Targets};
use crate::policy::eval::replay::{self, Weights};
use crate::policy::eval::{dataset, dataset_cli};
use anyhow::{Context, bail};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy component: world, imports, probe and the
    /// conformance suite (exit status 1 when anything fails).
    Check {
        file: PathBuf,
        /// Node configuration (policy parameters, deadline, targets);
        /// default: the one built into edgeroute (runtime-config/edgeroute.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Also require the reference policy's decisions (for ports of it).
        #[arg(long)]
        reference: bool,
        /// Random requests to try.
        #[arg(long, default_value_t = 500)]
        cases: u32,
    },
    /// Write a ready-to-build policy project: sources, build script, the
    /// WIT, a case file and a README.
    New {
        name: String,
        #[arg(long, value_enum)]
        lang: policy::template::Lang,
        /// Where to create the project's folder.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Run table-driven cases (JSON lines: features in, expected decision
    /// or reason out, outcomes to observe in between) against a policy;
    /// the last line reads `N passed, M failed` (exit status 1 when M > 0).
    Test {
        file: PathBuf,
        cases: PathBuf,
        /// Node configuration (policy parameters, targets); default: the
        /// one built into edgeroute.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Estimate how a candidate would have done, before anyone swaps it in.
    ///
    /// On a node's decision log (`edgeroute up --decision-log FILE`):
    /// inverse-propensity, direct and doubly-robust estimates of its mean
    /// reward, against the live policy's.
    ///
    /// On a labelled dataset (JSON lines with `messages` and `targets`,
    /// e.g. data/routing-qa/heldout.jsonl): its quality, cost and cloud
    /// share, APGR and CPT(50%)/CPT(80%) over a sweep of one parameter,
    /// against all-local, all-cloud, random, the length threshold, the
    /// confidence cascade and the oracle.
    Replay {
        /// A decision log or a labelled dataset.
        log: PathBuf,
        file: PathBuf,
        /// Node configuration (the candidate's parameters and deadline;
        /// for a dataset also the local model that counts tokens and the
        /// embedding model).
        #[arg(long, default_value = "runtime-config/edgeroute.toml")]
        config: PathBuf,
        #[command(flatten)]
        weights: Weights,
        /// Dataset only: replay this split first (the candidate learns from
        /// it as live; only the evaluation split is scored).
        #[arg(long)]
        train: Option<PathBuf>,
        /// Dataset only: run once per value of one `[policy.params]` entry,
        /// e.g. `cost_weight=0,20,40,80`: the candidate's cost–quality curve.
        #[arg(long)]
        sweep: Option<String>,
        /// Dataset only: draw the curves into this SVG file.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Swap a running node's policy (PUT /admin/policy).
    Swap {
        file: PathBuf,
        #[command(flatten)]
        node: NodeClient,
    },
    /// Go back to the previous policy (POST /admin/policy/rollback).
    Rollback {
        #[command(flatten)]
        node: NodeClient,
    },
    /// Show the active and previous policy versions (GET /admin/policy).
    Show {
        #[command(flatten)]
        node: NodeClient,
    },
}

#[derive(clap::Args)]
pub struct NodeClient {
    /// The node's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    node: String,
    /// Admin bearer token.
    #[arg(long, env = "EDGEROUTE_ADMIN_TOKEN", hide_env_values = true)]
    token: String,
}

impl NodeClient {
    /// One admin call; prints the node's answer. reqwest, the host's one
    /// HTTP client (upstream calls use it too), on the CLI's runtime.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.node.trim_end_matches('/'));
        let mut request = reqwest::Client::new()
            .request(method, &url)
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the node at {url}"))?;
        let status = response.status();
        let text = response.text().await?;
        let pretty = serde_json::from_str::<serde_json::Value>(&text)
            .map(|v| serde_json::to_string_pretty(&v).unwrap_or(text.clone()))
            .unwrap_or(text);
        println!("{pretty}");
        if !status.is_success() {
            bail!("the node answered {status}");
        }
        Ok(())
    }
}

pub async fn policy(command: PolicyCommand) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Check {
            file,
            config,
            reference,
            cases,
        } => check(file, load(config.as_deref())?, reference, cases).await,
        PolicyCommand::Test {
            file,
            cases,
            config,
        } => test(file, cases, load(config.as_deref())?).await,
        PolicyCommand::New { name, lang, dir } => {
            let project = policy::template::create(&name, lang, &dir)?;
            println!("created {}:", project.display());
            println!("  cd {} && bash build.sh", project.display());
            println!("  edgeroute policy check policy.wasm");
            println!("  edgeroute policy test policy.wasm cases.jsonl");
            Ok(())
        }
        PolicyCommand::Replay {
            log,
            file,
            config,
            weights,
            train,
            sweep,
            plot,
            json,
        } => {
            let text = std::fs::read_to_string(&log)
                .with_context(|| format!("cannot read {}", log.display()))?;
            if dataset::looks_like_dataset(&text) {
                let options = dataset_cli::Options {
                    train,
                    sweep,
                    plot,
                    json,
                };
                return dataset_cli::replay(&text, &log, &file, &config, options).await;
            }
            if train.is_some() || sweep.is_some() || plot.is_some() {
                bail!(
                    "--train, --sweep and --plot need a labelled dataset; {} is a decision log",
                    log.display()
                );
            }
            replay_log(&text, log, file, config, weights, json).await
        }
        PolicyCommand::Swap { file, node } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            node.send(reqwest::Method::PUT, "/admin/policy", Some(bytes))
                .await
        }
        PolicyCommand::Rollback { node } => {
            node.send(reqwest::Method::POST, "/admin/policy/rollback", None)
                .await
        }
        PolicyCommand::Show { node } => {
            node.send(reqwest::Method::GET, "/admin/policy", None).await
        }
    }
}

async fn replay_log(
    text: &str,
    log: PathBuf,
    file: PathBuf,
    config: PathBuf,
    weights: Weights,
    json: bool,
) -> anyhow::Result<()> {
    let config = Config::load(&config)?;
    let (decided, feedback) = replay::read(text)?;
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let engine = crate::runtime::engine()?;
    let candidate =
        policy::admit(&engine, bytes, file.display().to_string(), &config.policy).await?;
    let report = replay::replay(&candidate, &decided, &feedback, &weights).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "replayed {} decisions ({} with feedback) from {}",
        report.records,
        feedback.len(),
        log.display()
    );
    println!("  mean reward of the live policy:  {:.4}", report.logged);
    println!(
        "  candidate {}: IPS {:.4}  DM {:.4}  DR {:.4}  (agrees on {:.1} %)",
        file.display(),
        report.ips,
        report.dm,
        report.dr,
        report.agreement * 100.0
    );
    println!("  live plans:      {:?}", report.logged_plans);
    println!("  candidate plans: {:?}", report.candidate_plans);
    if report.deterministic_logging {
        println!(
            "  note: the live policy logged no propensities (deterministic): IPS only sees the requests where the candidate agrees"
        );
    }
    Ok(())
}

/// The config at `path`, or the default one built into the binary: a
/// policy author can check a component from any folder.
fn load(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
    match path {
        Some(path) => Config::load(path),
        None => Config::embedded(),
    }
}

/// The last line of `check` and `test`: every check or case is either
/// passed or failed, and a failure is [`Failed`] (exit status 1).
fn tally(passed: usize, failed: usize) -> anyhow::Result<()> {
    use std::io::Write;
    println!("{passed} passed, {failed} failed");
    std::io::stdout().flush()?;
    if failed > 0 {
        return Err(Failed.into());
    }
    Ok(())
}

/// Checks or cases failed, as the tally printed: `main` exits with status
/// 1 without another message (after the log is written out).
#[derive(Debug)]
pub struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed")
    }
}

impl std::error::Error for Failed {}

async fn test(file: PathBuf, cases: PathBuf, config: Config) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&cases)
        .with_context(|| format!("cannot read {}", cases.display()))?;
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let engine = crate::runtime::engine()?;
    println!("testing {} with {}", file.display(), cases.display());
    let version = policy::admit(&engine, bytes, file.display().to_string(), &config.policy).await?;
    let verdicts = policy::eval::cases::run(&version, &config, &text).await;
    let mut failed = 0;
    for verdict in &verdicts {
        match &verdict.failure {
            None => println!("  ok   {}", verdict.name),
            Some(why) => {
                failed += 1;
                println!("  FAIL {}: {why}", verdict.name);
            }
        }
    }
    if verdicts.is_empty() {
        bail!("{} holds no cases", cases.display());
    }
    tally(verdicts.len() - failed, failed)
}

async fn check(file: PathBuf, config: Config, reference: bool, cases: u32) -> anyhow::Result<()> {
    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let engine = crate::runtime::engine()?;
    println!("checking {} ({} bytes)", file.display(), bytes.len());
    let version =
        match policy::admit(&engine, bytes, file.display().to_string(), &config.policy).await {
            Ok(version) => version,
            Err(why) => {
                println!("  FAIL admission: {why:#}");
                return tally(0, 1);
            }
        };
    println!(
        "  ok   admission: compiles, imports only what a policy may, implements the policy world, passes the probe ({:.1} ms)",
        version.load_ms
    );
    println!("  info stateful (snapshot/restore): {}", version.stateful);
    println!(
        "  info needs: {}",
        if version.needs.embedding {
            "the prompt embedding ([local.embedding] must be configured)"
        } else {
            "no costly signal"
        }
    );
    let targets = Targets {
        local: config.local.models.iter().map(|m| m.name.clone()).collect(),
        cloud: config
            .cloud
            .upstreams
            .iter()
            .map(|u| u.name.clone())
            .collect(),
    };
    let findings = conformance::check(&version, &targets, reference, cases).await;
    let mut failed = 0;
    for finding in &findings {
        match &finding.failure {
            None => println!("  ok   {}", finding.check),
            Some(why) => {
                failed += 1;
                println!("  FAIL {}: {why}", finding.check);
            }
        }
    }
    println!(
        "  info memory per instance: {} KiB",
        version
            .memory_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            / 1024
    );
    // Admission is the first check.
    tally(findings.len() + 1 - failed, failed)
}
