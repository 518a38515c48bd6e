//! Clients and tenants: API keys, each mapped to a tenant with a default
//! sensitivity, the targets it may use and a rate limit.
//!
//! The config holds only each key's SHA-256 (or the name of an environment
//! variable with the keys), so a leaked config file leaks no key. A
//! presented key is hashed and compared with every known digest in
//! constant time, without stopping at the first match.
//!
//! With no tenant configured the node is open: every client is the `open`
//! tenant (public by default, all targets, no limit), and `edgeroute up`
//! refuses a non-loopback address unless told `--insecure-open`.

use crate::config::{Config, TenantConfig, TenantTarget};
use anyhow::{Context, bail};
use edgeroute_core::Sensitivity;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The tenant of every client of a node that has no keys.
pub const OPEN: &str = "open";

pub struct Tenant {
    pub name: String,
    /// Every request of this tenant is at least this sensitive.
    pub sensitivity: Sensitivity,
    /// Whether its requests may run off the node at all.
    pub cloud: bool,
    /// Whether it may report its own cloud calls (a Spin gateway).
    pub egress_reports: bool,
    limiter: Option<DefaultDirectRateLimiter>,
}

impl Tenant {
    fn open() -> Self {
        Self {
            name: OPEN.to_string(),
            sensitivity: Sensitivity::Public,
            cloud: true,
            egress_reports: false,
            limiter: None,
        }
    }

    fn from_config(name: &str, config: &TenantConfig) -> Self {
        let limiter = NonZeroU32::new(config.requests_per_minute)
            .map(|n| RateLimiter::direct(Quota::per_minute(n)));
        Self {
            name: name.to_string(),
            sensitivity: config.sensitivity,
            cloud: config.targets.contains(&TenantTarget::Cloud),
            egress_reports: config.egress_reports,
            limiter,
        }
    }

    /// Count one request against the tenant's rate; Err is how long until
    /// the next one would be admitted.
    pub fn admit(&self) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| {
            not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ))
        })
    }
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("sensitivity", &self.sensitivity)
            .field("cloud", &self.cloud)
            .finish_non_exhaustive()
    }
}

/// Why a client was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthorized {
    Missing,
    Wrong,
}

pub struct Clients {
    keys: Vec<([u8; 32], Arc<Tenant>)>,
    open: Arc<Tenant>,
}

impl Clients {
    pub fn from_config(config: &Config) -> anyhow::Result<Self> {
        let mut keys: Vec<([u8; 32], Arc<Tenant>)> = Vec::new();
        for (name, tenant_config) in &config.tenants {
            let tenant = Arc::new(Tenant::from_config(name, tenant_config));
            let mut digests = Vec::new();
            for hex in &tenant_config.keys_sha256 {
                digests.push(parse_digest(hex).with_context(|| format!("tenants.{name}"))?);
            }
            if let Some(var) = &tenant_config.keys_env {
                // Named but unset must not quietly leave the tenant without
                // keys (or the node open): refuse to start.
                let value = std::env::var(var).unwrap_or_default();
                let from_env: Vec<&str> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .collect();
                if from_env.is_empty() {
                    bail!(
                        "tenants.{name}.keys_env: the environment variable {var} is unset or holds no key"
                    );
                }
                digests.extend(from_env.into_iter().map(digest));
            }
            if digests.is_empty() {
                bail!(
                    "tenants.{name} has no key: add keys_sha256 (`edgeroute key new {name}`) or keys_env"
                );
            }
            // Targets name where requests may run; every request can run
            // locally (the guard's fallback), so `local` must be there.
            if !tenant_config.targets.contains(&TenantTarget::Local) {
                bail!(
                    "tenants.{name}.targets must include \"local\" (cloud-only tenants are not supported)"
                );
            }
            // One key, one tenant: a key pasted under a restricted and a
            // public tenant must not quietly pick one.
            for digest in &digests {
                if let Some((_, other)) = keys.iter().find(|(d, _)| d == digest) {
                    bail!(
                        "a key of tenants.{name} is also a key of tenants.{}: each key names one tenant",
                        other.name
                    );
                }
            }
            keys.extend(digests.into_iter().map(|d| (d, tenant.clone())));
        }
        Ok(Self {
            keys,
            open: Arc::new(Tenant::open()),
        })
    }

    /// The tenant of a request another node of the fleet forwarded: its
    /// own node checked the client's key and rate; the sensitivity it
    /// found travels with the request.
    pub fn open_tenant(&self) -> Arc<Tenant> {
        self.open.clone()
    }

    /// Whether clients must present a key.
    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The tenant an `Authorization` header value belongs to.
    pub fn identify(&self, authorization: Option<&str>) -> Result<Arc<Tenant>, Unauthorized> {
        if !self.required() {
            return Ok(self.open.clone());
        }
        let token = authorization
            .and_then(bearer_token)
            .ok_or(Unauthorized::Missing)?;
        let presented = digest(token);
        // Every digest is compared, so the time taken does not say which
        // (or whether any) matched.
        let mut found = None;
        for (known, tenant) in &self.keys {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(tenant);
            }
        }
        found.cloned().ok_or(Unauthorized::Wrong)
    }

    /// Every configured tenant (once each).
    pub fn tenants(&self) -> impl Iterator<Item = Arc<Tenant>> + '_ {
        let mut seen = std::collections::BTreeSet::new();
        self.keys
            .iter()
            .filter(move |(_, t)| seen.insert(t.name.clone()))
            .map(|(_, t)| t.clone())
    }
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme name is
/// case-insensitive (RFC 9110 §11.1), so Spin's `bearer` works too.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether two secrets are equal, in time that depends only on their
/// lengths.
pub fn same_secret(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Tenant names are labels in the ledger and keys in TOML: letters,
/// digits, `-` and `_`.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        bail!("tenant name '{name}': use 1 to 64 letters, digits, '-' or '_'");
    }
    Ok(())
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_digest(hex: &str) -> anyhow::Result<[u8; 32]> {
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        bail!("'{hex}' is not a SHA-256 in hex");
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .with_context(|| format!("'{hex}' is not a SHA-256 in hex"))?;
    }
    Ok(out)
}

/// A new random API key and the config line that admits it.
pub fn new_key(tenant: &str) -> anyhow::Result<(String, String)> {
    check_name(tenant)?;
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let key = format!(
        "er-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let hex: String = digest(&key).iter().map(|b| format!("{b:02x}")).collect();
    Ok((
        key,
        format!("[tenants.{tenant}]\nkeys_sha256 = [\"{hex}\"]"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn clients(toml: &str) -> anyhow::Result<Clients> {
        Clients::from_config(&Config::parse(toml, Path::new("."))?)
    }

    #[test]
    fn a_node_without_tenants_is_open() {
        let c = clients("").unwrap();
        assert!(!c.required());
        assert_eq!(c.identify(None).unwrap().name, OPEN);
    }

    #[test]
    fn keys_are_matched_by_digest_and_the_scheme_in_any_case() {
        let (key, line) = new_key("clinic").unwrap();
        let c = clients(&format!(
            "{line}\nsensitivity = \"restricted\"\ntargets = [\"local\"]\n"
        ))
        .unwrap();
        assert!(c.required());
        for header in [
            format!("Bearer {key}"),
            format!("bearer {key}"),
            format!("BEARER  {key} "),
        ] {
            let tenant = c.identify(Some(&header)).unwrap();
            assert_eq!(tenant.name, "clinic");
            assert_eq!(tenant.sensitivity, Sensitivity::Restricted);
            assert!(!tenant.cloud);
        }
        assert_eq!(c.identify(None).unwrap_err(), Unauthorized::Missing);
        assert_eq!(
            c.identify(Some("Bearer ")).unwrap_err(),
            Unauthorized::Missing
        );
        assert_eq!(c.identify(Some(&key)).unwrap_err(), Unauthorized::Missing);
        assert_eq!(
            c.identify(Some(&format!("Bearer {key}x"))).unwrap_err(),
            Unauthorized::Wrong
        );
    }

    #[test]
    fn a_keys_variable_that_is_unset_refuses_to_start() {
        let error = clients("[tenants.a]\nkeys_env = \"EDGEROUTE_TEST_NO_SUCH_VAR\"\n")
            .err()
            .unwrap();
        assert!(
            format!("{error:#}").contains("EDGEROUTE_TEST_NO_SUCH_VAR"),
            "{error:#}"
        );
        assert!(clients("[tenants.a]\n").is_err());
        let (_, line) = new_key("a").unwrap();
        let twice = format!("{line}\n{}", line.replace("tenants.a", "tenants.b"));
        assert!(format!("{:#}", clients(&twice).err().unwrap()).contains("also a key"));
        assert!(clients(&format!("{line}\ntargets = [\"cloud\"]\n")).is_err());
        assert!(clients("[tenants.a]\nkeys_sha256 = [\"abc\"]\n").is_err());
    }

    #[test]
    fn the_rate_limit_admits_a_burst_then_says_how_long_to_wait() {
        let (_, line) = new_key("t").unwrap();
        let c = clients(&format!("{line}\nrequests_per_minute = 2\n")).unwrap();
        let tenant = &c.keys[0].1;
        assert!(tenant.admit().is_ok());
        assert!(tenant.admit().is_ok());
        let wait = tenant.admit().unwrap_err();
        assert!(
            wait > Duration::from_secs(1) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
    }
}
