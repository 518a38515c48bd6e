//! The request pipeline, outside the HTTP layer:
//!
//! `request` (parse + validate) → `features` → policy → guard → dispatch
//! (`run`) → account (ledger, the policy's `observe`).
//!
//! It returns domain results — a [`Served`] request (finished, or a stream
//! to relay) or a [`Failure`] — that the API only renders as JSON or SSE.
//! `edgeroute bench` runs the same [`decide`], and so will a replay.
//! The guard (`edgeroute_core::guard`) is asked at every hop: the first
//! placement and every fallback after a local failure.

mod cascade;
pub mod features;
pub mod request;
mod run;

use crate::bindings::target::{ChatRequest, Completion, Message};
use crate::metrics::ReasonClass;
use crate::node::Node;
use crate::policy::PolicyVersion;
use crate::targets::TargetFailure;
use crate::targets::{Delta, Taint};
use cascade::Judge;
use edgeroute_core::guard::{self, Facts, LocalFailure, NodeView, PeerView, Placement};
use edgeroute_core::timing::Timing;
use edgeroute_core::{
    Choice, Decision, Features, Outcome, PolicyFailure, Prices, Refused, Target, TargetKind, Usage,
};
use features::Extracted;
pub use features::Signals;
use request::tools;
pub use request::{Invalid, InvalidKind, Prepared};
use run::{FirstEvent, Run};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Where a request ran (or was headed) and why.
#[derive(Debug, Clone)]
pub struct Route {
    /// None when the request was refused before reaching any target.
    pub target: Option<Target>,
    pub reason: String,
    /// The policy version that decided.
    pub policy_id: Option<String>,
    /// The local model's confidence in the answer, when it was known
    /// before the response started (a finished local answer, a judged
    /// cascade).
    pub confidence: Option<f32>,
    /// Prompt tokens the local model continued from its prefix cache.
    pub cached_tokens: Option<u32>,
    /// When a busy local model may take the request again, in seconds
    /// (`Retry-After` on a 503).
    pub retry_after_s: Option<u32>,
    /// The pipeline's steps and the hop so far, as a `Server-Timing`
    /// header value.
    pub server_timing: String,
}

/// Why a request was not served.
#[derive(Debug)]
pub enum Failure {
    /// The request itself is wrong (before any routing).
    Invalid(Invalid),
    /// The policy or the guard refused it.
    Refused { refused: Refused, route: Route },
    /// The node itself failed (a bug, not the request): HTTP 500.
    Internal(String),
    /// The target it was placed on failed before producing any text.
    Target {
        failure: TargetFailure,
        route: Route,
    },
    /// The local answer was judged below the caller's `x-edgeroute-judge`
    /// and not sent: the caller escalates. Nothing left the node.
    Declined {
        confidence: f32,
        min_confidence: f32,
        route: Route,
    },
}

/// A completion that ended.
#[derive(Debug, Clone)]
pub struct Finished {
    pub text: String,
    /// An upstream's answer message, returned as it wrote it (tool calls).
    pub message: Option<serde_json::Value>,
    pub finish_reason: String,
    pub usage: Usage,
}

/// A request being answered.
pub struct Served {
    pub id: String,
    pub created: u64,
    /// The client asked for server-sent events.
    pub stream: bool,
    pub include_usage: bool,
    /// The model name the answer carries: the local model, or the
    /// upstream's model for a cloud run.
    pub model: String,
    pub route: Route,
    pub output: Output,
}

pub enum Output {
    /// The target finished before any text was streamed.
    Done(Finished),
    /// Text is flowing; relay it with [`Stream::next`], then [`Stream::finish`].
    /// Boxed: the stream carries the whole request context.
    Streaming(Box<Stream>),
}

/// Which part of a request a ledger entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// The answer the client got (or the failure it saw).
    Answer,
    /// A second target a cascade tried that failed.
    FailedEscalation,
    /// A cascade's first answer, replaced by the second target's.
    Escalated,
}

/// Everything the later steps need about one request.
struct Context {
    node: Arc<Node>,
    /// The version that decided also receives `observe`.
    policy: Arc<PolicyVersion>,
    request: Prepared,
    extracted: Extracted,
    started: Instant,
    /// The first hop's confidence when a cascade judged it; the outcome
    /// reports it even when another target served the answer.
    judged: Option<f32>,
    /// The policy's decision as a label, and its propensity (the log).
    decision: (String, Option<f32>),
    /// Targets tried so far (more than one: a fallback served it).
    hops: usize,
    /// Peers already tried: not offered to the guard again.
    tried_peers: Vec<String>,
    /// The grammar of the request's tool calls, once the local model is
    /// to serve them (`local_cannot_serve`).
    tool_grammar: Option<Arc<str>>,
    /// Each step's time, for the answer's `Server-Timing`.
    timing: Timing,
    /// `x-edgeroute-judge`: a local first hop judged below this is
    /// declined, for a caller that escalates by itself.
    decline_below: Option<f32>,
}

/// A request after policy and guard, not yet dispatched.
pub struct Decided {
    ctx: Context,
    placement: Placement,
}

impl Decided {
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn features(&self) -> &Features {
        &self.ctx.extracted.features
    }
}

/// Parse → features → policy → guard.
/// Bodies up to this size get their features on the async worker (see
/// `decide`): detection and tokenizing take well under 100 µs there.
const INLINE_FEATURES_BYTES: usize = 1024;

pub async fn decide(
    node: &Arc<Node>,
    body: &[u8],
    signals: &Signals,
    id: String,
    created: u64,
) -> Result<Decided, Failure> {
    let started = Instant::now();
    let mut timing = Timing::start();
    let mut request =
        request::parse(body, &node.config.limits, id, created).map_err(Failure::Invalid)?;
    request.requested_model = node
        .config
        .model_alias(&request.requested_model)
        .to_string();
    check_model(node, &request.requested_model).map_err(Failure::Invalid)?;
    let decline_below = judge_header(signals).map_err(Failure::Invalid)?;
    timing.mark("parse");
    // Tokenizing a long prompt takes milliseconds of CPU: off the async
    // workers, so a large request cannot stall `/healthz` or other clients.
    // A short one takes tens of microseconds, less than the hand-off to a
    // blocking thread and back: it is done here. The embedding costs
    // milliseconds: only for a policy that asked, on the local worker.
    let embed = node.policy.current().needs.embedding;
    let inline = body.len() <= INLINE_FEATURES_BYTES;
    let work = {
        let (node, signals) = (node.clone(), signals.clone());
        move || {
            let extracted = features::extract(
                &request,
                &signals,
                &features::Sources {
                    guard: &node.config.guard,
                    detector: &node.detector,
                    local: &node.local,
                    cloud: &node.cloud,
                    fleet: node.fleet.as_deref(),
                },
            );
            (request, extracted)
        }
    };
    let (request, extracted) = if inline {
        work()
    } else {
        tokio::task::spawn_blocking(work).await.map_err(|e| {
            Failure::Internal(format!("computing the request's features failed: {e}"))
        })?
    };
    let mut extracted = extracted.map_err(Failure::Invalid)?;
    if let (true, Some(embedder), Some(config)) =
        (embed, &node.embedder, &node.config.local.embedding)
    {
        extracted.features.embedding =
            features::embed_prompt(node, &request, embedder, config.feature_tokens).await;
    }
    timing.mark("features");
    let asked = Instant::now();
    let (policy, decision) = node.policy.route(&extracted.features).await;
    node.metrics.policy_call(&policy.id, asked.elapsed());
    node.shadow.compare(&extracted.features, &decision);
    timing.mark("policy");
    let logged = (
        crate::policy::convert::label(&decision),
        decision.as_ref().ok().and_then(|d| d.propensity),
    );
    let ctx = Context {
        node: node.clone(),
        policy,
        request,
        extracted,
        started,
        judged: None,
        decision: logged,
        hops: 0,
        tried_peers: Vec::new(),
        tool_grammar: None,
        timing,
        decline_below,
    };
    if !ctx.facts().may_leave
        && let Some(cloud) = named_cloud(&decision)
        && let Ok(decided) = &decision
    {
        ctx.audit_refused_by_guard(&cloud, &decided.reason);
    }
    let placement = ctx.with_view(|view| guard::place(decision, &ctx.extracted.facts, view));
    let mut ctx = ctx;
    ctx.timing.mark("guard");
    Ok(Decided { ctx, placement })
}

/// The whole pipeline.
pub async fn serve(
    node: &Arc<Node>,
    body: &[u8],
    signals: &Signals,
    id: String,
    created: u64,
) -> Result<Served, Failure> {
    dispatch(decide(node, body, signals, id, created).await?).await
}

/// Run the placement; when the target fails before producing any text, ask
/// the guard for the next hop (local busy or unavailable → cloud if the
/// request may leave; cloud failed → local if a model is there). No target
/// is tried twice, so an upstream never receives the same request again.
pub async fn dispatch(decided: Decided) -> Result<Served, Failure> {
    let Decided {
        mut ctx,
        mut placement,
    } = decided;
    // Targets already tried, so a fallback never sends the request to the
    // same place twice (local → cloud → local → … cannot happen), nor to a
    // second target off the node (`guard::may_try`). `reached` leaves out
    // a peer that refused the connection: nothing of the request left.
    let mut tried: Vec<Target> = Vec::new();
    let mut reached: Vec<Target> = Vec::new();
    // The first failure, answered when every fallback is used up.
    let mut failed: Option<(Run, TargetFailure)> = None;
    loop {
        let (target, reason, judge) = match placement {
            Placement::Refuse(refused) => return Err(ctx.refused(refused).await),
            Placement::Run { target, reason } => (target, reason, None),
            Placement::Cascade {
                first,
                then,
                min_confidence,
                reason,
            } => (
                first,
                reason,
                Some(Judge {
                    then,
                    min_confidence,
                    decline: false,
                }),
            ),
        };
        // A caller that escalates by itself (`x-edgeroute-judge`) has a
        // local first hop judged against its minimum, in place of any
        // cascade the node planned.
        let judge = match ctx.decline_below {
            Some(min) if tried.is_empty() && target.kind() == TargetKind::Local => {
                Some(Judge::declining(min))
            }
            _ => judge,
        };
        if tried.contains(&target) || !guard::may_try(&reached, &target) {
            let (run, failure) = failed.expect("a target is refused only after a failure");
            return ctx.answer(run, FirstEvent::Ended(Err(failure))).await;
        }
        tried.push(target.clone());
        reached.push(target.clone());
        if let Target::Peer(name) = &target {
            ctx.tried_peers.push(name.clone());
        }
        ctx.hops = tried.len();
        if target.kind() == TargetKind::Local
            && let Some(failure) = ctx.local_cannot_serve()
        {
            placement = ctx.next_hop(&failure, &reason);
            continue;
        }
        let mut run = ctx.launch(target, reason);
        let first = run.first_event().await;
        ctx.mark_hop(&run);
        let FirstEvent::Ended(Err(failure)) = first else {
            // A fallback hop is not judged: the cascade was planned for
            // the first target only.
            return match judge {
                Some(judge) => cascade::judge(ctx, run, first, judge).await,
                None => ctx.answer(run, first).await,
            };
        };
        let next = match (&run.target, &failure) {
            (Target::Local(_), TargetFailure::Busy(queue)) => {
                Some(ctx.next_hop(&LocalFailure::Busy { queue: *queue }, &run.reason))
            }
            (Target::Local(_), TargetFailure::Unavailable(why)) => {
                Some(ctx.next_hop(&LocalFailure::Unavailable(why.clone()), &run.reason))
            }
            // A bad request stays bad wherever it runs.
            (Target::Cloud(_) | Target::Peer(_), TargetFailure::BadRequest(_)) => None,
            // The peer never received it: the node tries again as if its
            // local model had been busy (another peer, the cloud when the
            // request may leave, else a refusal).
            (Target::Peer(_), TargetFailure::Unreachable(why)) => {
                reached.pop();
                let why = format!("{why}; the local queue");
                Some(ctx.next_hop(&LocalFailure::Unavailable(why), &run.reason))
            }
            (Target::Cloud(_) | Target::Peer(_), failure) => ctx.with_view(|view| {
                guard::after_cloud_failure(&failure.to_string(), &run.reason, view)
            }),
            _ => None,
        };
        match next {
            Some(next) => {
                placement = next;
                failed.get_or_insert((run, failure));
            }
            None => return ctx.answer(run, FirstEvent::Ended(Err(failure))).await,
        }
    }
}

/// The first cloud target a policy's plan names, if any.
fn named_cloud(decision: &Result<Decision, PolicyFailure>) -> Option<Target> {
    let plan = &decision.as_ref().ok()?.choice;
    let targets = match plan {
        Choice::Run(target) => vec![target],
        Choice::Cascade(c) => vec![&c.first, &c.then],
        Choice::Reject(_) => vec![],
    };
    targets
        .into_iter()
        .find(|t| t.kind() == TargetKind::Cloud)
        .cloned()
}

/// The minimum confidence `x-edgeroute-judge` asks for, if sent.
fn judge_header(signals: &Signals) -> Result<Option<f32>, Invalid> {
    let Some(value) = &signals.judge else {
        return Ok(None);
    };
    match value.trim().parse::<f32>() {
        // Above 1 no answer clears it, as a cascade's threshold may be.
        Ok(min) if min > 0.0 && min.is_finite() => Ok(Some(min)),
        _ => Err(Invalid::request(format!(
            "x-edgeroute-judge must be a confidence above 0, got {value:?}"
        ))),
    }
}

/// `model` may name a configured local model, an upstream, or `auto`;
/// where the request runs is the policy's call either way.
fn check_model(node: &Node, model: &str) -> Result<(), Invalid> {
    let known = model == "auto"
        || node.config.local.models.iter().any(|m| m.name == model)
        || node.cloud.upstream(model).is_some();
    if known {
        return Ok(());
    }
    Err(Invalid {
        kind: InvalidKind::UnknownModel,
        message: format!(
            "the model '{model}' does not exist on this node; GET /v1/models lists the ones that do"
        ),
        param: Some("model"),
    })
}

impl Context {
    fn facts(&self) -> &Facts {
        &self.extracted.facts
    }

    fn features(&self) -> &Features {
        &self.extracted.features
    }

    fn with_view<R>(&self, f: impl FnOnce(&NodeView) -> R) -> R {
        let local_models = self.node.local.model_names();
        let upstreams = self.node.cloud.upstream_names();
        let features = self.features();
        let peers: Vec<PeerView> = features
            .peers
            .iter()
            .filter(|p| !self.tried_peers.iter().any(|t| **t == *p.name))
            .map(|p| PeerView {
                name: &p.name,
                same_zone: p.same_zone,
            })
            .collect();
        let peer_pick = features
            .peer_pick
            .as_deref()
            .filter(|pick| peers.iter().any(|p| p.name == *pick));
        f(&NodeView {
            local_models: &local_models,
            default_local: self.node.default_local_model(),
            upstreams: &upstreams,
            on_policy_failure: self.node.config.policy.on_failure,
            peers: &peers,
            peer_pick,
        })
    }

    fn next_hop(&self, failure: &LocalFailure, reason: &str) -> Placement {
        self.with_view(|view| guard::after_local_failure(failure, reason, self.facts(), view))
    }

    /// What the local model cannot serve: a request that needs an
    /// upstream, tool calls `[local] tool_calls` leaves to one (or whose
    /// schema has no grammar), or a prompt longer than its context.
    fn local_cannot_serve(&mut self) -> Option<LocalFailure> {
        if let Some(what) = self.request.needs_cloud {
            return Some(LocalFailure::Unsupported(what.to_string()));
        }
        if let Some(offered) = &self.request.tools {
            let mode = self.node.config.local.tool_calls;
            if let Some(why) = mode.refusal(self.facts().may_leave) {
                return Some(LocalFailure::Unsupported(why.to_string()));
            }
            match offered.grammar(&request::schema_grammar) {
                Ok(grammar) => self.tool_grammar = Some(grammar),
                Err(e) => {
                    tracing::info!("a tool's parameters have no local grammar: {e}");
                    return Some(LocalFailure::Unsupported(
                        "a tool's parameters schema the local model cannot follow".to_string(),
                    ));
                }
            }
        }
        let context = self.node.config.local.context_size;
        let prompt_tokens = self.features().prompt_tokens;
        (prompt_tokens + 1 > context).then_some(LocalFailure::TooLong {
            prompt_tokens,
            context,
        })
    }

    fn launch(&self, target: Target, reason: String) -> Run {
        let mut decoding = self.request.decoding.clone();
        let mut request = self.chat_request();
        if target.kind() == TargetKind::Local
            && let Some(grammar) = &self.tool_grammar
        {
            decoding.grammar = Some(grammar.clone());
            // A call is returned whole, as `tool_calls`, once it is parsed.
            request.stream = false;
        }
        let local = run::LocalInputs {
            cache: self.extracted.cache.clone(),
            prompt: self.extracted.prompt.clone(),
            // Only the local backend reads it: an upstream gets `stop`,
            // `response_format` and `tools` in the client's own body.
            decoding,
        };
        let taint = self.taint(&reason);
        // Only an upstream or a peer gets the client's own body: the local
        // model is served from the fields the node interprets.
        if target.leaves_node() {
            request.passthrough = serde_json::to_string(&self.request.passthrough).ok();
        }
        Run::launch(&self.node, target, reason, request, taint, local)
    }

    /// The hop's step in `Server-Timing`, until its first token or its
    /// whole answer (whichever comes first), and for a cloud call that got
    /// an answer the upstream's part of it: what is left is the node's own.
    fn mark_hop(&mut self, run: &Run) {
        self.timing.mark(run.target.kind().name());
        if let Some(wait) = run.upstream_wait() {
            self.timing.part("upstream", wait);
            if let Target::Cloud(upstream) = &run.target {
                self.node.metrics.upstream_wait(upstream, wait);
            }
        }
    }

    fn taint(&self, reason: &str) -> Taint {
        Taint {
            request_id: self.request.id.clone(),
            may_leave: self.facts().may_leave,
            policy: self.policy.id.clone(),
            reason: reason.to_string(),
            sensitivity: self.facts().sensitivity.name(),
            prompt_tokens: self.features().prompt_tokens,
            may_stay_in_zone: self.facts().may_stay_in_zone,
        }
    }

    /// The policy named a cloud target for a request that may not leave:
    /// the guard keeps it on the node, and the audit log says so.
    fn audit_refused_by_guard(&self, cloud: &Target, policy_reason: &str) {
        let audit = &self.node.cloud.audit;
        let reason = format!("policy chose {}: {policy_reason}", self.decision.0);
        let mut record = audit.record(
            crate::audit::Event::Refused,
            &self.taint(&reason),
            &cloud.to_string(),
        );
        record.refused_by = Some("guard");
        audit.write(record);
    }

    /// Which class of reason put the answer on `served_by`.
    fn reason_class(&self, served_by: Option<&Target>) -> ReasonClass {
        let Some(served) = served_by else {
            return ReasonClass::Refused;
        };
        let (plan, served) = (self.decision.0.as_str(), served.to_string());
        if plan == "failed" {
            return ReasonClass::PolicyFailure;
        }
        let (first, then) = plan.split_once('→').unwrap_or((plan, ""));
        if served == first && self.hops <= 1 {
            ReasonClass::Policy
        } else if served == then && self.judged.is_some() {
            ReasonClass::Escalated
        } else if self.hops > 1 {
            ReasonClass::Fallback
        } else {
            ReasonClass::Override
        }
    }

    fn chat_request(&self) -> ChatRequest {
        let r = &self.request;
        ChatRequest {
            model: String::new(),
            messages: r
                .messages
                .iter()
                .map(|(role, content)| Message {
                    role: role.clone(),
                    content: content.clone(),
                })
                .collect(),
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            seed: r.seed,
            stream: r.stream,
            passthrough: None,
        }
    }

    /// The local model's estimated wait for a slot, in whole seconds (at
    /// least 1): when a client refused for a full queue should come back.
    fn retry_after_s(&self) -> u32 {
        self.node.local.wait_ms().div_ceil(1000).max(1)
    }

    fn route(&self, target: Option<Target>, reason: String) -> Route {
        // What detection found (kinds, never the text), so a client sees
        // why its request stayed.
        let detected = &self.extracted.features.detected;
        let reason = if detected.is_empty() {
            reason
        } else {
            format!("{reason}; detected: {}", detected.join(", "))
        };
        Route {
            target,
            reason,
            policy_id: Some(self.policy.id.clone()),
            confidence: self.judged,
            cached_tokens: None,
            retry_after_s: None,
            server_timing: self.timing.header(),
        }
    }

    /// The route of an answer from `run`: with the prefix it reused.
    fn run_route(&self, run: &Run) -> Route {
        let reused = run.reused_tokens();
        let mut route = self.route(Some(run.target.clone()), run.reason.clone());
        if reused > 0 {
            route.reason = format!(
                "{}; {reused} prompt tokens from the prefix cache",
                route.reason
            );
            route.cached_tokens = Some(reused);
        }
        route
    }

    /// The id of a local tool call: the request's, which is unique.
    fn tool_call_id(&self) -> String {
        let id = &self.request.id;
        format!("call_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
    }

    /// The model name a run's answer carries.
    fn model_label(&self, target: &Target) -> String {
        match target {
            Target::Cloud(name) => self
                .node
                .cloud
                .upstream(name)
                .map(|u| u.model.clone())
                .unwrap_or_default(),
            other => other.name().to_string(),
        }
    }

    async fn refused(&self, refused: Refused) -> Failure {
        self.node.metrics.refusal(refused.cause.code());
        self.finish_request(None, false, Usage::default(), None, None)
            .await;
        let mut route = self.route(None, refused.reason.clone());
        if let edgeroute_core::Refusal::LocalBusy { .. } = refused.cause {
            route.retry_after_s = Some(self.retry_after_s());
        }
        Failure::Refused { refused, route }
    }

    /// Local runs count prompt tokens the same way the features did; an
    /// upstream's own count wins for cloud runs when it reports one. A
    /// local answer under a tool grammar that is a call becomes
    /// `tool_calls`.
    fn finished(&self, target: &Target, completion: Completion) -> Finished {
        let prompt_tokens = match completion.usage.prompt_tokens {
            0 => self.features().prompt_tokens,
            n => n,
        };
        let call = (target.kind() == TargetKind::Local && self.tool_grammar.is_some())
            .then(|| tools::call_message(&completion.text, &self.tool_call_id()))
            .flatten();
        let (text, message, finish_reason) = match call {
            Some(call) => (String::new(), Some(call), "tool_calls".to_string()),
            None => (
                completion.text,
                completion
                    .message
                    .and_then(|m| serde_json::from_str(&m).ok()),
                completion.finish_reason,
            ),
        };
        Finished {
            text,
            message,
            finish_reason,
            usage: Usage {
                prompt_tokens,
                completion_tokens: completion.usage.completion_tokens,
            },
        }
    }

    async fn answer(self, run: Run, first: FirstEvent) -> Result<Served, Failure> {
        let held = match first {
            FirstEvent::Delta(delta) => VecDeque::from([delta]),
            FirstEvent::Ended(ended) => return self.answer_ended(run, ended).await,
        };
        Ok(self.answer_streaming(run, held))
    }

    /// The target finished before its answer was sent.
    async fn answer_ended(
        mut self,
        run: Run,
        ended: Result<Completion, TargetFailure>,
    ) -> Result<Served, Failure> {
        let mut route = self.run_route(&run);
        let completion = match ended {
            Ok(completion) => completion,
            Err(failure) => {
                self.account(&run, false, Usage::default()).await;
                match failure {
                    TargetFailure::Busy(_) => route.retry_after_s = Some(self.retry_after_s()),
                    // The upstream's own word on when to come back.
                    TargetFailure::RateLimited {
                        retry_after_s: Some(s),
                        ..
                    } => route.retry_after_s = Some(s),
                    _ => {}
                }
                return Err(Failure::Target { failure, route });
            }
        };
        route.confidence = route.confidence.or_else(|| run.confidence());
        self.judged = route.confidence;
        let finished = self.finished(&run.target, completion);
        self.account(&run, true, finished.usage).await;
        Ok(self.served(&run, route)(Output::Done(finished)))
    }

    /// Text is flowing: `held` is what arrived before the answer began.
    fn answer_streaming(self, run: Run, held: VecDeque<Delta>) -> Served {
        let route = self.run_route(&run);
        let served = self.served(&run, route);
        served(Output::Streaming(Box::new(Stream {
            pending: held,
            run,
            ctx: self,
        })))
    }

    /// The answer's envelope, to be filled with its output.
    fn served(&self, run: &Run, route: Route) -> impl FnOnce(Output) -> Served + use<> {
        let r = &self.request;
        let (id, created, stream, include_usage) =
            (r.id.clone(), r.created, r.stream, r.include_usage);
        let model = self.model_label(&run.target);
        move |output| Served {
            id,
            created,
            stream,
            include_usage,
            model,
            route,
            output,
        }
    }

    /// One leg's ledger entry: what ran where, for how long, at what
    /// cost. Only a cloud run that succeeded is charged: a failed call
    /// costs nothing. A cascade has two legs; other requests one.
    fn record_leg(
        &self,
        served_by: Option<&Target>,
        ok: bool,
        usage: Usage,
        leg: Leg,
        confidence: Option<f32>,
    ) -> (Usage, f64) {
        let usage = Usage {
            prompt_tokens: match usage.prompt_tokens {
                0 => self.features().prompt_tokens,
                n => n,
            },
            ..usage
        };
        let cost_usd = match served_by {
            Some(Target::Cloud(name)) if ok => self
                .node
                .cloud
                .upstream(name)
                .map(|u| {
                    Prices {
                        usd_per_mtok_in: u.usd_per_mtok_in,
                        usd_per_mtok_out: u.usd_per_mtok_out,
                    }
                    .cost(usage)
                })
                .unwrap_or(0.0),
            _ => 0.0,
        };
        self.node.ledger.record(crate::ledger::Entry {
            served_by,
            sensitivity: self.facts().sensitivity,
            tenant: &self.extracted.tenant,
            task: &self.features().task,
            usage,
            latency_ms: self.started.elapsed().as_secs_f64() * 1e3,
            cost_usd,
            latency_budget_ms: self.features().latency_budget_ms,
            confidence,
            escalated: leg == Leg::Escalated,
        });
        (usage, cost_usd)
    }

    /// The request's last leg: its ledger entry, the upstream's measured
    /// speed, the log line and the policy's `observe`, once per request.
    async fn account(&self, run: &Run, ok: bool, usage: Usage) {
        if ok && let Target::Cloud(name) = &run.target {
            let ttft = run
                .first_text
                .map(|t| t.duration_since(run.started).as_secs_f64() * 1e3);
            let total = run.started.elapsed().as_secs_f64() * 1e3;
            self.node
                .cloud
                .observe_speed(name, ttft, total, usage.completion_tokens);
        }
        let confidence = self.judged.or_else(|| run.confidence());
        self.finish_request(Some(&run.target), ok, usage, confidence, run.first_text)
            .await;
    }

    async fn finish_request(
        &self,
        served_by: Option<&Target>,
        ok: bool,
        usage: Usage,
        confidence: Option<f32>,
        first_text: Option<Instant>,
    ) {
        let took = self.started.elapsed();
        let latency_ms = took.as_secs_f64() * 1e3;
        let (usage, cost_usd) = self.record_leg(served_by, ok, usage, Leg::Answer, confidence);
        self.node.metrics.request(&crate::metrics::Finished {
            placement: served_by.map(Target::kind),
            reason: self.reason_class(served_by),
            sensitivity: self.facts().sensitivity.name(),
            ok,
            duration: took,
            first_text: first_text.map(|t| t.duration_since(self.started)),
            completion_tokens: usage.completion_tokens,
        });
        let served = crate::policy::convert::served_by(served_by);
        tracing::info!(
            request_id = %self.request.id,
            served_by = %served,
            ok,
            latency_ms = latency_ms as u64,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            confidence,
            sensitivity = %self.extracted.sensitivity.explain(),
            "request finished"
        );
        let outcome = Outcome {
            request_id: self.request.id.clone(),
            served_by: served_by.cloned(),
            ok,
            latency_ms: latency_ms as u32,
            usage,
            cost_micro_usd: (cost_usd * 1e6).round() as u64,
            confidence,
            feedback: None,
        };
        self.node
            .recent
            .remember(&self.policy, &outcome, &self.extracted.tenant);
        if let Some(log) = &self.node.decisions {
            log.write(&crate::decisions::Line::Decision(Box::new(
                crate::decisions::Decided {
                    id: self.request.id.clone(),
                    policy: self.policy.id.clone(),
                    // Never the prompt's embedding: it is a representation
                    // of the text, which the log never holds.
                    features: edgeroute_core::Features {
                        embedding: None,
                        ..self.features().clone()
                    },
                    decision: self.decision.0.clone(),
                    propensity: self.decision.1,
                    outcome: (&outcome).into(),
                    at_ms: Some(crate::audit::now_ms()),
                },
            )));
        }
        self.node.policy.observe(&self.policy, &outcome).await;
    }
}

/// A streamed answer: relay [`Stream::next`] until it returns `None` (or
/// the client is gone), then [`Stream::finish`] accounts for the request.
pub struct Stream {
    ctx: Context,
    run: Run,
    /// Text that arrived before the answer began (one piece, or the tokens
    /// a cascade held back while judging).
    pending: VecDeque<Delta>,
}

impl Stream {
    pub async fn next(&mut self) -> Option<Delta> {
        match self.pending.pop_front() {
            Some(delta) => Some(delta),
            None => self.run.deltas.recv().await,
        }
    }

    /// Wait for the target's result. Dropping the text channel first tells
    /// a target whose client went away to stop generating.
    pub async fn finish(self: Box<Self>) -> Result<Finished, TargetFailure> {
        let Stream { ctx, mut run, .. } = *self;
        run.deltas.close();
        match run::join(&mut run.task).await {
            Ok(completion) => {
                let finished = ctx.finished(&run.target, completion);
                ctx.account(&run, true, finished.usage).await;
                Ok(finished)
            }
            Err(failure) => {
                ctx.account(&run, false, Usage::default()).await;
                Err(failure)
            }
        }
    }
}
