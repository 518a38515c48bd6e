use anyhow::Context;
use clap::{Parser, Subcommand};
use edgeroute::config::Config;
use edgeroute::node::Node;
use std::io::Write;
use std::path::PathBuf;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// mimalloc instead of glibc's malloc (a tenth of a cloud call's CPU
/// was glibc's malloc and free): per-thread free lists, no arena locks.
/// `edgeroute bench --proxy-only`, 2026-12-05: non-streaming added p50
/// 507-522 -> 455-476 µs (3 and 6 runs). Built with `no_thp`: mimalloc
/// does not ask for transparent huge pages (`MADV_HUGEPAGE`) on its own
/// memory (the process's other memory is untouched; on a host whose THP
/// setting is `always` the kernel may still use them). Asking, a fresh
/// heap page faulted in 2 MiB of zeroes on a request's path, and idle RSS
/// rose 362 -> 414 MiB, past the batching benchmark's bound; without,
/// 373 MiB, and llama.cpp's decode and prefill speeds unchanged.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "edgeroute",
    version,
    about = "Edge inference router: local llama.cpp or cloud, per request, decided by a WebAssembly policy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct NodeArgs {
    /// Node configuration file.
    #[arg(
        long,
        default_value = "runtime-config/edgeroute.toml",
        env = "EDGEROUTE_CONFIG"
    )]
    config: PathBuf,
    /// Replace a configured upstream's base URL (repeatable).
    #[arg(long = "upstream", value_name = "NAME=URL")]
    upstreams: Vec<String>,
    /// Use this policy component instead of the configured one.
    #[arg(long, value_name = "FILE.wasm")]
    policy: Option<PathBuf>,
    /// Keep state across restarts here (overrides [node] state_dir).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Append decisions and outcomes to this JSON-lines file (overrides
    /// [node] decision_log), for `edgeroute policy replay`.
    #[arg(long, value_name = "FILE")]
    decision_log: Option<PathBuf>,
    /// This node's name in the fleet (overrides [fleet] node): one config
    /// for many nodes, e.g. a Kubernetes DaemonSet's `$(NODE_NAME)`.
    #[arg(long, value_name = "NAME")]
    fleet_node: Option<String>,
    /// The URL peers reach this node at (overrides [fleet] url), e.g.
    /// `http://$(POD_IP):8080`.
    #[arg(long, value_name = "URL")]
    fleet_url: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node.
    Up {
        #[command(flatten)]
        node: NodeArgs,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Serve a non-loopback address with no client keys configured
        /// (anyone who can reach the port is a client).
        #[arg(long)]
        insecure_open: bool,
    },
    /// Client API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Measure generation through wasi-nn against llama.cpp called directly,
    /// the policy call, and the host's per-request overhead.
    Bench {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        options: edgeroute::bench::Options,
    },
    /// Turn a ledger snapshot (`GET /ledger`) or a decision log into a
    /// self-contained HTML traffic report with plots.
    Report {
        /// A ledger snapshot (JSON) or a decision log (JSON lines).
        input: PathBuf,
        #[arg(short, long, default_value = "edgeroute-report.html")]
        output: PathBuf,
        /// The node's config: its first upstream's prices value the local
        /// answers of a decision log.
        #[arg(long, env = "EDGEROUTE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Pre-initialise a component (wasmtime's Wizer): run its
    /// `wizer-initialize` export once and write a component that starts
    /// from the state it left. `spin build` runs it on the Spin gateway,
    /// so each request's fresh instance has the detector compiled.
    Preinit { input: PathBuf, output: PathBuf },
    /// Check a policy component offline, or manage a running node's policy.
    Policy {
        #[command(subcommand)]
        command: edgeroute::cli::PolicyCommand,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Make a random key for a tenant; print the key (give it to the
    /// client) and the config lines that admit it (only its SHA-256).
    New { tenant: String },
}

fn load_config(args: &NodeArgs) -> anyhow::Result<Config> {
    let mut config = Config::load(&args.config)?;
    for spec in &args.upstreams {
        config.override_upstream(spec)?;
    }
    if let Some(policy) = &args.policy {
        config.policy.component = Some(policy.clone());
    }
    if let Some(dir) = &args.state_dir {
        config.node.state_dir = Some(dir.clone());
    }
    if let Some(log) = &args.decision_log {
        config.node.decision_log = Some(log.clone());
    }
    if args.fleet_node.is_some() || args.fleet_url.is_some() {
        let fleet = config
            .fleet
            .as_mut()
            .context("--fleet-node and --fleet-url need a [fleet] section in the config")?;
        if let Some(name) = &args.fleet_node {
            fleet.node = name.clone();
        }
        if let Some(url) = &args.fleet_url {
            fleet.url = url.clone();
        }
        config.validate()?;
    }
    Ok(config)
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    // A node logs what it does; the other commands print their own report.
    let default_filter = match cli.command {
        Command::Up { .. } => "info,wasmtime_wasi_nn=off",
        _ => "warn,wasmtime_wasi_nn=off",
    };
    // Batched by a thread of its own (log_writer.rs says why); stderr
    // directly if that thread cannot start.
    let (writer, flushing) = match edgeroute::log_writer::start(std::io::stderr()) {
        Ok((batched, flushing)) => (BoxMakeWriter::new(batched), Some(flushing)),
        Err(error) => {
            eprintln!("edgeroute: the log writer did not start ({error}); writing each line");
            (BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDGEROUTE_LOG")
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(writer)
        // Colours only on a terminal: a log file or a collector gets plain
        // `key=value` text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = run(cli).await;
    // What the log holds goes out before the process does.
    drop(flushing);
    if let Err(error) = result {
        // A tally of failed checks said it already.
        if error.downcast_ref::<edgeroute::cli::Failed>().is_none() {
            eprintln!("edgeroute: {error:#}");
        }
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up {
            node,
            listen,
            insecure_open,
        } => {
            let mut config = load_config(&node)?;
            // Before the models load, so a refusal comes in a moment.
            let listener = edgeroute::serve::listen(&listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            let addr = listener.local_addr()?;
            if let Some(fleet) = config.fleet.as_mut()
                && fleet.url.is_empty()
            {
                fleet.url = format!("http://{addr}");
            }
            let open = !edgeroute::tenants::Clients::from_config(&config)?.required();
            if !addr.ip().is_loopback() && open && !insecure_open {
                anyhow::bail!(
                    "refusing to serve {addr} with no client keys: anyone who can reach it could use the node and read its ledger. Add a tenant with a key (`edgeroute key new NAME`), listen on 127.0.0.1, or pass --insecure-open"
                );
            }
            let node = Node::start(config).await?;
            // Tests and scripts wait for this exact line.
            println!("edgeroute listening on http://{addr}");
            std::io::stdout().flush()?;
            let policy = node.policy.current();
            eprintln!(
                "policy: {} ({}); local models: {:?}; cloud upstreams: {:?}; admin endpoints: {}; client keys: {}",
                policy.id,
                policy.source,
                node.local.model_names(),
                node.cloud.upstream_names(),
                if node.admin_token.is_some() {
                    "on"
                } else {
                    "off"
                },
                if node.clients.required() {
                    "required"
                } else {
                    "none (open node)"
                },
            );
            eprintln!(
                "dashboard: http://{addr}/dashboard; metrics: http://{addr}/metrics; egress audit log: {}",
                node.cloud
                    .audit
                    .log
                    .as_ref()
                    .map_or_else(|| "off".to_string(), |log| log.path().display().to_string()),
            );
            edgeroute::reload::spawn(&node);
            if let Some(fleet) = &node.fleet {
                eprintln!(
                    "fleet: node '{}' in zone '{}' at {}; load store: {}",
                    fleet.name(),
                    fleet.config.zone,
                    fleet.config.url,
                    fleet
                        .config
                        .redis
                        .as_deref()
                        .unwrap_or("none (asking the configured peers)"),
                );
                edgeroute::fleet::sync::spawn(std::sync::Arc::downgrade(&node));
            }
            edgeroute::serve::serve(
                listener,
                edgeroute::api::router(node.clone()),
                (&node.config.limits).into(),
                shutdown(),
            )
            .await?;
            node.policy.persist().await;
            if let Some(log) = &node.cloud.audit.log {
                log.flush();
            }
            Ok(())
        }
        Command::Key {
            command: KeyCommand::New { tenant },
        } => {
            let (key, lines) = edgeroute::tenants::new_key(&tenant)?;
            println!("key: {key}\n\n# in the node's config:\n{lines}");
            Ok(())
        }
        Command::Bench { node, options } => {
            let config = load_config(&node)?;
            edgeroute::bench::run(config, options).await
        }
        Command::Preinit { input, output } => edgeroute::preinit::run(&input, &output).await,
        Command::Report {
            input,
            output,
            config,
        } => {
            let prices = match config {
                Some(path) => Some(Config::load(&path)?.reference_prices()),
                None => None,
            };
            let written = edgeroute::report::run(&input, &output, prices)?;
            println!(
                "wrote {}: {} requests in {} buckets, from a {}",
                output.display(),
                written.requests,
                written.buckets,
                if written.from_log {
                    "decision log"
                } else {
                    "ledger snapshot"
                }
            );
            Ok(())
        }
        Command::Policy { command } => edgeroute::cli::policy(command).await,
    }
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
