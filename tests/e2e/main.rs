//! End-to-end tests: the real `edgeroute` binary, the real SmolLM2 model, and
//! a recording loopback "cloud" (`edgeroute-testkit`, crates/testkit). One
//! test binary, a module per area:
//!
//! - `authoring`: `policy new` templates built and checked, `policy test`,
//!   a C policy's log line;
//! - `chat`: the OpenAI API, placement, the guard and fail-closed paths;
//! - `dataset`: scoring a policy on a labelled dataset (APGR, baselines);
//! - `deploy`: the fleet's Kubernetes manifests validated, and the nodes'
//!   config loading with the per-node flags;
//! - `fleet`: nodes sharing load through Redis, forwarding, trust zones,
//!   and the paced test backend;
//! - `embeddings`: `/v1/embeddings`, and the embedding a policy asks for;
//! - `observability`: `/metrics` (promtool), the egress audit log, and the
//!   dashboard in headless Chromium;
//! - `policy_swap`: hot swaps, rollback, state, shadow, the admin API;
//! - `policy_languages`: the reference policy in Python, JavaScript and C;
//! - `prefix`: prefix reuse for agent sessions, and its sensitivity fence;
//! - `signals`: every feature a policy sees, and the confidence cascade;
//! - `spin`: a Spin app's `llm::infer` and `generate_embeddings` through
//!   the node under the real `spin up`, both protocols, tenants' keys;
//! - `spin_gateway`: the root `spin.toml` under the real `spin up`, its
//!   gateway placing requests with the node's policy file and guard;
//! - `tenants`: client keys, a tenant's sensitivity, targets and rate
//!   limit, the ledger by tenant;
//! - `tools`: the `openai` client's tool-call round trip through the
//!   cloud, fields forwarded unchanged.
//!
//! Each test starts its own [`FakeCloud`](edgeroute_testkit::FakeCloud) and
//! node, so tests are independent and may run in parallel.
//!
//! Needs the model (`./dev setup`, or `bash scripts/fetch-models.sh`) and the
//! guest components built by `host/build.rs` (paths in [`components`]).

mod authoring;
mod batch;
mod chat;
mod dataset;
mod decoding;
mod deploy;
mod embeddings;
mod fleet;
mod observability;
mod policy_languages;
mod policy_swap;
mod prefix;
mod signals;
mod soak;
mod spin;
mod spin_gateway;
mod tenants;
mod tools;

use edgeroute_testkit::Edgeroute;

/// The binary under test: `EDGEROUTE.start(&cloud)`,
/// `EDGEROUTE.node(&cloud).max_queue(0).start()`, `EDGEROUTE.command()`.
const EDGEROUTE: Edgeroute = Edgeroute::new(env!("CARGO_BIN_EXE_edgeroute"));

/// Where `host/build.rs` put each guest component: `components::POLICY_TRAP`,
/// … (one constant per entry of its table, generated).
mod components {
    include!(concat!(env!("OUT_DIR"), "/components.rs"));
}

#[test]
fn every_component_is_where_its_constant_says() {
    for (dir, path) in components::ALL {
        assert!(
            std::path::Path::new(path).is_file(),
            "components/{dir}: {path} is missing"
        );
    }
}
