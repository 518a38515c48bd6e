//! The guest components built from `components/` by build.rs and embedded
//! in the binary, so `edgeroute up` needs no files besides the model.

macro_rules! embedded {
    ($file:literal) => {
        include_bytes!(concat!(env!("EDGEROUTE_COMPONENTS_DIR"), "/", $file))
    };
}

/// The default routing policy (`components/policy-default`).
pub const POLICY_DEFAULT: &[u8] = embedded!("policy_default.wasm");
/// The local worker (`components/local-worker`).
pub const LOCAL_WORKER: &[u8] = embedded!("local_worker.wasm");
/// The cloud-fetch component (`components/cloud-fetch`).
pub const CLOUD_FETCH: &[u8] = embedded!("cloud_fetch.wasm");
