//! What each kind of component may import. Checked when a component is
//! loaded, so a policy that asks for the network is refused with a message
//! instead of failing (or worse, working) later.

use anyhow::bail;
use wasmtime::Engine;
use wasmtime::component::Component;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Policy,
    LocalWorker,
    CloudFetch,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Policy => "routing policy",
            Role::LocalWorker => "local worker",
            Role::CloudFetch => "cloud-fetch",
        }
    }

    /// Interface prefixes this role may import. The WASI basics are what a
    /// language runtime pulls in (std's stdio and panic path, clocks,
    /// random); they are linked with an empty environment and no stdin.
    fn allowed(self) -> &'static [&'static str] {
        const BASICS: [&str; 5] = [
            "wasi:cli/",
            "wasi:clocks/",
            "wasi:random/",
            "wasi:io/",
            "wasi:logging/",
        ];
        match self {
            Role::Policy => &[
                BASICS[0],
                BASICS[1],
                BASICS[2],
                BASICS[3],
                BASICS[4],
                "edgeroute:routing/types",
                "wasi:nn/",
            ],
            Role::LocalWorker => &[
                BASICS[0],
                BASICS[1],
                BASICS[2],
                BASICS[3],
                BASICS[4],
                "edgeroute:routing/",
                "wasi:nn/",
            ],
            Role::CloudFetch => &[
                BASICS[0],
                BASICS[1],
                BASICS[2],
                BASICS[3],
                BASICS[4],
                "edgeroute:routing/",
                "wasi:http/",
            ],
        }
    }
}

/// Refuse a component whose imports exceed its role.
pub fn check(engine: &Engine, component: &Component, role: Role) -> anyhow::Result<()> {
    let allowed = role.allowed();
    let mut refused: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|name| !allowed.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    if !refused.is_empty() {
        refused.sort();
        bail!(
            "a {} may not import {} (allowed: {})",
            role.name(),
            refused.join(", "),
            allowed.join(" ")
        );
    }
    Ok(())
}
