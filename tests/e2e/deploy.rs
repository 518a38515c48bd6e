//! The fleet's Kubernetes manifests (`deploy/kubernetes`): every object
//! valid against the Kubernetes schemas (kubernetes-validate, strict) and
//! the SpinApp against its schema, a broken copy refused with each problem
//! named, and the nodes' config loading in the real binary with the
//! per-node flags the DaemonSet passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::EDGEROUTE;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn validate(dir: &Path) -> Output {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = Path::new(ROOT).join("scripts/validate-deploy.py");
    Command::new(&python)
        .arg(&script)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "run {python} {}: {e} (pip install -r tests/requirements.txt)",
                script.display()
            )
        })
}

fn manifests() -> PathBuf {
    Path::new(ROOT).join("deploy/kubernetes")
}

#[test]
fn the_kubernetes_manifests_are_valid_and_a_broken_copy_is_refused() {
    let output = validate(&manifests());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for kind in ["DaemonSet", "Deployment", "Service", "Namespace", "SpinApp"] {
        assert!(stdout.contains(kind), "no {kind} validated: {stdout}");
    }

    // The same folder with a port that is not a number, a misspelt SpinApp
    // field and a manifest kustomize would not apply.
    let broken = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(manifests()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, broken.path().join(path.file_name().unwrap())).unwrap();
    }
    let edit = |name: &str, from: &str, to: &str| {
        let path = broken.path().join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{name} has no '{from}'");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    };
    edit(
        "edgeroute-node.yaml",
        "containerPort: 8080",
        "containerPort: eighty",
    );
    edit("spin-sample.yaml", "replicas: 2", "replica: 2");
    std::fs::write(
        broken.path().join("extra.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: extra\n",
    )
    .unwrap();
    let output = validate(broken.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a broken copy passed: {stderr}");
    for problem in [
        "containerPort: 'eighty' is not of type 'integer'",
        "'replica' was unexpected",
        "does not list extra.yaml",
    ] {
        assert!(
            stderr.contains(problem),
            "'{problem}' not reported: {stderr}"
        );
    }
}

#[test]
fn the_daemonsets_config_loads_with_a_name_and_url_per_node() {
    let config = manifests().join("edgeroute.toml");
    let up = |extra: &[&str], spin_keys: Option<&str>| {
        let mut command = EDGEROUTE.command();
        command
            .args(["up", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(extra)
            .env_remove("EDGEROUTE_CONFIG")
            .env_remove("EDGEROUTE_SPIN_APP_KEYS")
            .env_remove("EDGEROUTE_GATEWAY_KEYS");
        // The Secret holds both tenants' keys.
        if let Some(keys) = spin_keys {
            command
                .env("EDGEROUTE_SPIN_APP_KEYS", keys)
                .env("EDGEROUTE_GATEWAY_KEYS", format!("{keys}-gateway"));
        }
        let output = command.output().unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let node = [
        "--fleet-node",
        "edge-1",
        "--fleet-url",
        "http://10.0.0.5:8080",
    ];
    // Without the Secret's client keys no node starts: no open node.
    let stderr = up(&node, None);
    assert!(
        stderr.contains("EDGEROUTE_SPIN_APP_KEYS is unset or holds no key"),
        "{stderr}"
    );
    // Parsed and checked, it gets as far as the model the image holds.
    let key = Some("er-a-client-key-for-the-spin-apps");
    let stderr = up(&node, key);
    assert!(
        stderr.contains("not found at /opt/edgeroute/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{stderr}"
    );
    // The per-node name is checked like the config's own.
    let stderr = up(&["--fleet-node", ""], key);
    assert!(
        stderr.contains("fleet.node must be a name of its own"),
        "{stderr}"
    );
}
