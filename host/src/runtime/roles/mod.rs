//! A role is a kind of guest component: the routing policy, the local
//! worker, the cloud fetcher. Each one is a file beside this one holding,
//! side by side, the store state its instances run with, the interfaces it
//! may import (`ALLOWED`) and the linker that provides them (`linker`).
//!
//! A component is checked against its role's `ALLOWED` when it is compiled,
//! so one that asks for more (a policy importing the network) is refused at
//! load time, naming what it asked for. The tests below link a component
//! using each allowed interface against the role's own linker: an interface
//! cannot be allowed without being linked, so a component that passes the
//! check does not fail later because its role lacks an interface.

/// The WASI basics a language runtime pulls in (std's stdio and panic path,
/// clocks, random), followed by a role's own interfaces. These are the
/// cli, clocks, io and random interfaces `wasmtime_wasi::p2::add_to_linker_async`
/// links; it links filesystem and sockets too, but no role may import them
/// (and `runtime::wasi` gives no preopened directory and no socket anyway).
macro_rules! with_wasi_basics {
    ($($interface:literal),* $(,)?) => {
        &[
            "wasi:cli/environment",
            "wasi:cli/exit",
            "wasi:cli/stdin",
            "wasi:cli/stdout",
            "wasi:cli/stderr",
            "wasi:cli/terminal-input",
            "wasi:cli/terminal-output",
            "wasi:cli/terminal-stdin",
            "wasi:cli/terminal-stdout",
            "wasi:cli/terminal-stderr",
            "wasi:clocks/monotonic-clock",
            "wasi:clocks/wall-clock",
            "wasi:io/error",
            "wasi:io/poll",
            "wasi:io/streams",
            "wasi:random/random",
            "wasi:random/insecure",
            "wasi:random/insecure-seed",
            $($interface),*
        ]
    };
}

pub mod cloud_fetch;
pub mod local_worker;
pub mod policy;

use anyhow::{Context, bail};
use std::path::Path;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The kind of a guest component; the file of the same name beside this
/// one says what it may import and how it is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Policy,
    LocalWorker,
    CloudFetch,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Policy, Role::LocalWorker, Role::CloudFetch];

    pub fn name(self) -> &'static str {
        match self {
            Role::Policy => "routing policy",
            Role::LocalWorker => "local worker",
            Role::CloudFetch => "cloud-fetch",
        }
    }
}

/// The interfaces a role may import, as `namespace:package/interface`
/// without a version: the linker serves every compatible version.
pub fn allowed(role: Role) -> &'static [&'static str] {
    match role {
        Role::Policy => policy::ALLOWED,
        Role::LocalWorker => local_worker::ALLOWED,
        Role::CloudFetch => cloud_fetch::ALLOWED,
    }
}

/// Compile a component and check its imports against its role.
pub fn compile(
    engine: &Engine,
    bytes: &[u8],
    role: Role,
    origin: &str,
) -> anyhow::Result<Component> {
    let component = Component::new(engine, bytes)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("{origin} is not a valid WebAssembly component"))?;
    check_imports(engine, &component, role).with_context(|| format!("{origin} refused"))?;
    Ok(component)
}

pub fn compile_file(engine: &Engine, path: &Path, role: Role) -> anyhow::Result<Component> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read {} component {}", role.name(), path.display()))?;
    compile(engine, &bytes, role, &path.display().to_string())
}

/// Refuse a component whose imports exceed its role.
fn check_imports(engine: &Engine, component: &Component, role: Role) -> anyhow::Result<()> {
    let allowed = allowed(role);
    let mut refused: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|name| !allowed.contains(&versionless(name)))
        .collect();
    if !refused.is_empty() {
        refused.sort();
        bail!(
            "a {} may not import {} (allowed: {})",
            role.name(),
            refused.join(", "),
            allowed.join(", ")
        );
    }
    Ok(())
}

/// `wasi:io/streams@0.2.3` → `wasi:io/streams`.
fn versionless(import: &str) -> &str {
    import
        .split_once('@')
        .map_or(import, |(interface, _version)| interface)
}

#[cfg(test)]
mod witnesses;

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Config;

    fn engine() -> Engine {
        let mut config = Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    /// Does the role's own linker satisfy `component`'s imports?
    fn links(engine: &Engine, role: Role, component: &Component) -> anyhow::Result<()> {
        match role {
            Role::Policy => {
                policy::linker(engine)?.instantiate_pre(component)?;
            }
            Role::LocalWorker => {
                local_worker::linker(engine)?.instantiate_pre(component)?;
            }
            Role::CloudFetch => {
                cloud_fetch::linker(engine)?.instantiate_pre(component)?;
            }
        }
        Ok(())
    }

    #[test]
    fn every_allowed_import_is_linked() {
        let engine = engine();
        for role in Role::ALL {
            for &interface in allowed(role) {
                let wat = witnesses::component(interface);
                let component = compile(&engine, wat.as_bytes(), role, interface)
                    .unwrap_or_else(|e| panic!("{}: {interface}: {e:#}", role.name()));
                assert!(
                    component
                        .component_type()
                        .imports(&engine)
                        .any(|(name, _)| versionless(name) == interface),
                    "the witness of {interface} does not import it"
                );
                if let Err(e) = links(&engine, role, &component) {
                    panic!("a {} may import {interface}, but: {e:#}", role.name());
                }
            }
        }
    }

    /// The witnesses have teeth: an interface a linker lacks fails to link.
    /// (An import of an empty instance would link anywhere: wasmtime only
    /// looks up the items an imported instance is declared to hold.)
    #[test]
    fn a_witness_does_not_link_where_its_interface_is_missing() {
        let engine = engine();
        for interface in ["wasi:nn/graph", "wasi:http/outgoing-handler"] {
            let wat = witnesses::component(interface);
            let component = Component::new(&engine, wat).unwrap();
            assert!(
                links(&engine, Role::Policy, &component).is_err(),
                "{interface}"
            );
        }
    }

    #[test]
    fn a_policy_may_not_import_models_or_the_network() {
        let engine = engine();
        for import in [
            "wasi:nn/graph@0.2.0-rc-2024-10-28",
            "wasi:http/outgoing-handler@0.2.0",
            "wasi:filesystem/preopens@0.2.0",
            "wasi:sockets/tcp@0.2.0",
        ] {
            let wat = format!(r#"(component (import "{import}" (instance)))"#);
            let error = compile(&engine, wat.as_bytes(), Role::Policy, "test policy")
                .err()
                .unwrap_or_else(|| panic!("a policy importing {import} was accepted"));
            let message = format!("{error:#}");
            assert!(message.contains(import), "{message}");
            assert!(message.contains("may not import"), "{message}");
        }
    }

    #[test]
    fn a_target_may_not_import_the_other_targets_capability() {
        let engine = engine();
        let cases = [
            (Role::LocalWorker, "wasi:http/outgoing-handler@0.2.0"),
            (Role::CloudFetch, "wasi:nn/graph@0.2.0-rc-2024-10-28"),
        ];
        for (role, import) in cases {
            let wat = format!(r#"(component (import "{import}" (instance)))"#);
            let error = compile(&engine, wat.as_bytes(), role, "test target")
                .err()
                .unwrap_or_else(|| panic!("a {} importing {import} was accepted", role.name()));
            assert!(format!("{error:#}").contains(import), "{error:#}");
        }
    }

    #[test]
    fn versions_are_ignored_when_checking() {
        assert_eq!(versionless("wasi:io/streams@0.2.3"), "wasi:io/streams");
        assert_eq!(
            versionless("wasi:nn/graph@0.2.0-rc-2024-10-28"),
            "wasi:nn/graph"
        );
        assert_eq!(versionless("plain"), "plain");
    }
}
