//! Clients and tenants: API keys made by `edgeroute key new`, a tenant's
//! default sensitivity and allowed targets (checked against what reached
//! the recording cloud), its rate limit, the ledger by tenant, and a node
//! that will not serve a public address without keys.

use edgeroute_testkit::{FakeCloud, LOCAL_MODEL, Resp, unique};
use serde_json::{Value, json};

use crate::EDGEROUTE;
use crate::components::POLICY_ALWAYS_CLOUD;

const ADMIN: &str = "tenants-admin-token";

/// `edgeroute key new TENANT`: the key and the config lines it prints.
fn new_key(tenant: &str) -> (String, String) {
    let out = EDGEROUTE
        .command()
        .args(["key", "new", tenant])
        .output()
        .expect("run edgeroute key new");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let key = text
        .lines()
        .find_map(|l| l.strip_prefix("key: "))
        .unwrap_or_else(|| panic!("no key in:\n{text}"))
        .to_string();
    let lines = text
        .split_once("# in the node's config:\n")
        .unwrap_or_else(|| panic!("no config lines in:\n{text}"))
        .1
        .to_string();
    (key, lines)
}

/// Over 64 tokens, so the default policy wants the cloud for it.
fn long_prompt(canary: &str) -> String {
    // The canary last: random letters beside "Reference" at the start
    // raise the prose classifier's score (chat.rs's long_prompt says more).
    format!(
        "Summarise in one line: {}. Reference {canary}.",
        ["the store's quarterly sales rose while supplier delays and staffing changes weighed on the outlook for the district"; 4].join("; ")
    )
}

fn chat(prompt: &str) -> Value {
    json!({
        "model": "auto",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
        "temperature": 0,
        "metadata": {"task": "summarise"},
    })
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// Served by the local model, the reason naming `why`.
#[track_caller]
fn assert_kept_local(resp: &Resp, why: &str) {
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(
        resp.target(),
        Some(format!("local:{LOCAL_MODEL}").as_str()),
        "{resp:?}"
    );
    assert!(resp.reason().unwrap_or_default().contains(why), "{resp:?}");
}

#[track_caller]
fn assert_envelope(resp: &Resp, status: u16, code: &str) {
    assert_eq!(resp.status, status, "{resp:?}");
    assert_eq!(resp.json()["error"]["code"], code, "{resp:?}");
    assert!(
        resp.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

#[test]
fn client_keys_name_a_tenant_whose_sensitivity_targets_and_rate_the_node_enforces() {
    let cloud = FakeCloud::start();
    let (clinic, clinic_toml) = new_key("clinic");
    let (web, web_toml) = new_key("web");
    let (edge, edge_toml) = new_key("edge-only");
    let (limited, limited_toml) = new_key("limited");
    // A policy that always answers cloud: what stays, the host kept.
    let node = EDGEROUTE
        .node(&cloud)
        .policy_component(POLICY_ALWAYS_CLOUD)
        .env("EDGEROUTE_ADMIN_TOKEN", ADMIN)
        .config_extra(&format!(
            "{clinic_toml}sensitivity = \"restricted\"\n{web_toml}{edge_toml}targets = [\"local\"]\n{limited_toml}requests_per_minute = 2\n[ledger]\ntasks = [\"translate\"]\n"
        ))
        .start();

    // No key, a wrong key, a key without its scheme: 401 in the envelope,
    // and nothing reached any target.
    let missing = node.post_chat(chat("hi"), &[]);
    assert_envelope(&missing, 401, "invalid_api_key");
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    assert_envelope(
        &node.post_chat(
            chat("hi"),
            &[("authorization", &bearer(&format!("{web}x")))],
        ),
        401,
        "invalid_api_key",
    );
    assert_envelope(
        &node.post_chat(chat("hi"), &[("authorization", &web)]),
        401,
        "invalid_api_key",
    );
    assert_envelope(&node.get_with("/v1/models", &[]), 401, "invalid_api_key");
    assert!(cloud.chat_requests().is_empty(), "{}", cloud.describe());
    // /healthz stays open for load balancers.
    assert_eq!(node.get("/healthz").status, 200);

    // A public tenant's prompt goes to the cloud; Spin's lower-case
    // scheme is accepted.
    let web_canary = unique("web-tenant");
    let resp = node.post_chat(
        chat(&long_prompt(&web_canary)),
        &[("authorization", &format!("bearer {web}"))],
    );
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(resp.target(), Some("cloud:frontier"), "{resp:?}");
    cloud.assert_received(&web_canary, 1);
    // Only the tenant that made a request may score it.
    let id = resp.json()["id"].as_str().unwrap().to_string();
    let feedback = json!({"id": id, "score": 1.0});
    let other = node.post_json(
        "/v1/feedback",
        feedback.clone(),
        &[("authorization", &bearer(&clinic))],
    );
    assert_envelope(&other, 404, "request_not_found");
    let own = node.post_json(
        "/v1/feedback",
        feedback,
        &[("authorization", &bearer(&web))],
    );
    assert_eq!(own.status, 200, "{own:?}");

    // The clinic tenant is restricted by default: even declared public, its
    // prompt stays local and never reaches the cloud.
    let clinic_canary = unique("clinic-tenant");
    let resp = node.post_chat(
        chat(&long_prompt(&clinic_canary)),
        &[
            ("authorization", &bearer(&clinic)),
            ("x-edgeroute-sensitivity", "public"),
        ],
    );
    assert_kept_local(&resp, "restricted");
    cloud.assert_received(&clinic_canary, 0);

    // A tenant limited to the node keeps even public data here, and the
    // reason says why.
    let edge_canary = unique("edge-tenant");
    let resp = node.post_chat(
        chat(&long_prompt(&edge_canary)),
        &[("authorization", &bearer(&edge))],
    );
    assert_kept_local(&resp, "tenant");
    cloud.assert_received(&edge_canary, 0);

    // Two a minute: the third is a 429 with Retry-After, in the envelope.
    let limited_auth = bearer(&limited);
    for _ in 0..2 {
        assert_eq!(
            node.get_with("/v1/models", &[("authorization", &limited_auth)])
                .status,
            200
        );
    }
    let over = node.post_chat(chat("hi"), &[("authorization", &limited_auth)]);
    assert_envelope(&over, 429, "rate_limit_exceeded");
    let retry: u64 = over
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{over:?}");

    // The ledger: no key → 401; a client sees its own tenant only; the
    // admin token sees all. Unlisted task text is `other`, never echoed.
    assert_envelope(&node.get("/ledger"), 401, "invalid_api_key");
    let tenants_of = |resp: Resp| -> Vec<String> {
        assert_eq!(resp.status, 200, "{resp:?}");
        let mut t: Vec<String> = resp.json()["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                assert_eq!(b["task"], "other", "{b}");
                b["tenant"].as_str().unwrap().to_string()
            })
            .collect();
        t.dedup();
        t
    };
    assert_eq!(
        tenants_of(node.get_with("/ledger", &[("authorization", &bearer(&clinic))])),
        ["clinic"]
    );
    assert_eq!(
        tenants_of(node.get_with("/ledger", &[("authorization", &bearer(ADMIN))])),
        ["clinic", "edge-only", "web"]
    );
    assert!(
        !node
            .get_with("/ledger", &[("authorization", &bearer(ADMIN))])
            .body_text
            .contains("summarise")
    );
}

#[test]
fn a_public_address_without_client_keys_is_refused_at_start() {
    let config = format!(
        "{}/runtime-config/edgeroute.toml",
        edgeroute_testkit::REPO_ROOT
    );
    let out = EDGEROUTE
        .command()
        .args(["up", "--config", &config, "--listen", "0.0.0.0:0"])
        .output()
        .expect("run edgeroute up");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--insecure-open") && stderr.contains("no client keys"),
        "{stderr}"
    );
}
