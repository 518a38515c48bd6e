//! edgeroute's vocabulary, below everything else: where a request may run
//! ([`Target`]), how sensitive it is ([`Sensitivity`], collected from every
//! place a level can come from), what a policy answered ([`Decision`]), why
//! a request was refused ([`Refusal`], a cause rather than an HTTP status),
//! what it cost ([`Usage`], [`Prices`]) and the [`guard`] that turns a
//! policy's answer into a placement the policy cannot override.
//!
//! Nothing here knows wasmtime, HTTP or llama.cpp: the host converts its
//! WIT bindings into these types in one place, and the HTTP layer maps a
//! refusal to a status code in one place.

pub mod confidence;
pub mod cost;
pub mod decision;
pub mod estimate;
pub mod features;
pub mod fleet;
pub mod guard;
pub mod outcome;
pub mod refusal;
pub mod sensitivity;
pub mod target;
pub mod timing;

pub use confidence::Confidence;
pub use cost::{Prices, Usage};
pub use decision::{Cascade, Choice, Decision, PolicyFailure};
pub use estimate::{Estimate, Ewma, Speed};
pub use features::{Features, Needs, PeerFeature, TextStats};
pub use guard::{NodeView, OnPolicyFailure, PeerView, Placement, Rules};
pub use outcome::Outcome;
pub use refusal::{Refusal, Refused};
pub use sensitivity::{Sensitivity, SensitivitySet, Source, UnknownSensitivity};
pub use target::{Target, TargetKind, UnknownTarget};
