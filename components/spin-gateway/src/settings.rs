//! The gateway's configuration: Spin variables (spin.toml `[variables]`,
//! overridden at `spin up` with `SPIN_VARIABLE_<NAME>` or a variables
//! provider). A value the gateway cannot read refuses every request: a
//! misread `never_leave` must not let data out.

use edgeroute_core::Sensitivity;
use edgeroute_core::guard::{OnPolicyFailure, Rules};

pub struct Settings {
    /// The edgeroute node on this server: local work goes there.
    pub node_url: String,
    /// The client key the gateway presents to the node (a tenant confined
    /// to `local`, so the node never sends the gateway's local work out).
    pub node_key: String,
    /// The node's local models, as the policy names them.
    pub local_models: Vec<String>,
    /// The cloud upstream: its name (as the policy names it), its chat
    /// completions URL, the model it is asked for, and its key (a secret).
    pub upstream_name: String,
    pub upstream_url: String,
    pub upstream_model: String,
    pub upstream_key: String,
    pub rules: Rules,
    pub detect_pii: bool,
    /// The node's `[guard] patterns`, `allow`, `prose_threshold` and
    /// `prose_classifier_threshold`.
    pub detect_patterns: Vec<edgeroute_detect::Pattern>,
    pub detect_allow: Vec<String>,
    pub prose_threshold: f32,
    pub prose_classifier_threshold: f32,
    /// `[policy.params]` of the node, as `key=value` pairs.
    pub policy_params: Vec<(String, String)>,
}

async fn var(name: &str) -> Result<String, String> {
    spin_sdk::variables::get(name)
        .await
        .map_err(|e| format!("Spin variable '{name}': {e}"))
}

/// The settings, read on an instance's first request and kept for the
/// rest: Spin reuses an instance for many requests, and reading the
/// variables is about a tenth of a millisecond each time. A variable a
/// provider changes (a rotated secret in a vault) is seen by the next
/// instance. A failed read is not kept: every request tries again and is
/// refused until the variables read.
pub async fn get() -> Result<&'static Settings, String> {
    static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
    if let Some(settings) = SETTINGS.get() {
        return Ok(settings);
    }
    let loaded = Settings::load().await?;
    Ok(SETTINGS.get_or_init(|| loaded))
}

impl Settings {
    async fn load() -> Result<Self, String> {
        let list = |text: String| -> Vec<String> {
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let never_leave = list(var("never_leave").await?)
            .iter()
            .map(|level| {
                level
                    .parse::<Sensitivity>()
                    .map_err(|e| format!("never_leave: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let on_policy_failure = match var("on_policy_failure").await?.trim() {
            "local" => OnPolicyFailure::Local,
            "error" => OnPolicyFailure::Error,
            other => {
                return Err(format!(
                    "on_policy_failure: '{other}' is not local or error"
                ));
            }
        };
        let detect_pii = match var("detect_pii").await?.trim() {
            "true" => true,
            "false" => false,
            other => return Err(format!("detect_pii: '{other}' is not true or false")),
        };
        let policy_params = list(var("policy_params").await?)
            .into_iter()
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_owned(), v.trim().to_owned())),
                None => Err(format!("policy_params: '{pair}' is not key=value")),
            })
            .collect::<Result<_, _>>()?;
        let json = |name: &'static str, text: String| {
            move |e: serde_json::Error| format!("{name}: not a JSON list ({e}): {text}")
        };
        let text = var("detect_patterns").await?;
        let detect_patterns = serde_json::from_str(&text).map_err(json("detect_patterns", text))?;
        let text = var("detect_allow").await?;
        let detect_allow = serde_json::from_str(&text).map_err(json("detect_allow", text))?;
        let text = var("prose_threshold").await?;
        let prose_threshold = text
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| format!("prose_threshold: '{text}' is not a positive number"))?;
        let text = var("prose_classifier_threshold").await?;
        let prose_classifier_threshold = text
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|t| *t > 0.0 && *t <= 1.0)
            .ok_or_else(|| {
                format!("prose_classifier_threshold: '{text}' is not a number in (0, 1]")
            })?;
        Ok(Self {
            node_url: var("node_url").await?.trim_end_matches('/').to_owned(),
            node_key: var("node_key").await?,
            local_models: list(var("local_models").await?),
            upstream_name: var("upstream_name").await?,
            upstream_url: var("upstream_url").await?,
            upstream_model: var("upstream_model").await?,
            upstream_key: var("upstream_key").await?,
            rules: Rules {
                never_leave,
                on_policy_failure,
            },
            detect_pii,
            detect_patterns,
            detect_allow,
            prose_threshold,
            prose_classifier_threshold,
            policy_params,
        })
    }

    pub fn upstreams(&self) -> Vec<String> {
        if self.upstream_url.is_empty() {
            Vec::new()
        } else {
            vec![self.upstream_name.clone()]
        }
    }
}
