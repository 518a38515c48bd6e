//! `edgeroute policy replay DATASET candidate.wasm`: a policy scored on a
//! labelled dataset against the baselines, with exact numbers on a tiny
//! dataset whose answers are known.

use crate::EDGEROUTE;
use crate::components::{POLICY_ALWAYS_CLOUD, POLICY_BANDIT};
use edgeroute_testkit::unique;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The repository's embedded default config: SmolLM2 counts the tokens,
/// MiniLM embeds, the upstream is `frontier`.
fn config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-config/edgeroute.toml")
}

/// Local is right, and sure, on the two short questions; wrong, and
/// unsure, on the two long ones. The cloud is right on all four. Ids end
/// in `suffix`, so copies make a training split.
fn tiny(suffix: &str) -> String {
    let example = |id: &str, text: &str, local: f64, confidence: f64| {
        json!({
            "id": format!("{id}{suffix}"), "category": if local > 0.5 { "easy" } else { "hard" },
            "messages": [{"role": "user", "content": text}], "max_tokens": 8,
            "targets": {
                "local": {"quality": local, "latency_ms": 300, "cost_usd": 0.0, "confidence": confidence},
                "cloud": {"quality": 1.0, "latency_ms": 600, "cost_usd": 0.00001}
            }
        })
        .to_string()
    };
    [
        example("a", "What is 2 plus 2?", 1.0, 0.9),
        example("b", "Capital of France?", 1.0, 0.8),
        example("c", "Multiply 4821 by 3907 and then subtract the square of 97 from the product, showing no work.", 0.0, 0.3),
        example("d", "Name the element whose atomic number is 76 and give its standard atomic weight to four places.", 0.0, 0.6),
    ]
    .join("\n")
}

fn replay(dataset: &Path, candidate: &str, extra: &[&str]) -> Value {
    EDGEROUTE.policy_replay(dataset, candidate, &config(), extra)
}

fn curve<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["curves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str().unwrap().starts_with(name))
        .unwrap_or_else(|| panic!("no curve {name}: {report}"))
}

#[track_caller]
fn assert_close(value: &Value, want: f64) {
    let got = value
        .as_f64()
        .unwrap_or_else(|| panic!("{value} is not a number"));
    assert!((got - want).abs() < 1e-9, "{got} != {want}");
}

#[test]
fn a_tiny_labelled_dataset_gives_the_exact_apgr() {
    let dir = std::env::temp_dir().join(unique("dataset"));
    std::fs::create_dir_all(&dir).unwrap();
    let dataset = dir.join("tiny.jsonl");
    std::fs::write(&dataset, tiny("")).unwrap();

    let report = replay(&dataset, POLICY_ALWAYS_CLOUD, &[]);
    assert_eq!(report["examples"], 4);
    assert_close(&report["all_local"]["quality"], 0.5);
    assert_close(&report["all_cloud"]["quality"], 1.0);
    // Oracle: (0,0) (¼,½) (½,1) (1,1) → 1/16 + 3/16 + ½ = ¾.
    assert_close(&curve(&report, "oracle")["apgr"], 0.75);
    assert_close(&curve(&report, "oracle")["cpt50"], 0.25);
    assert_close(&curve(&report, "random")["apgr"], 0.5);
    // Confidence orders the examples as the oracle does, and so does the
    // length: the two long prompts are the two wrong ones.
    assert_close(&curve(&report, "confidence cascade")["apgr"], 0.75);
    assert_close(&curve(&report, "length threshold")["apgr"], 0.75);
    // Everything to the cloud: one point at (1, 1), the random diagonal.
    let always = curve(&report, "candidate");
    assert_close(&always["apgr"], 0.5);
    assert_close(&always["points"][0]["cloud_share"], 1.0);
    assert_close(&always["points"][0]["quality"], 1.0);
    assert_close(&always["points"][0]["cost_usd"], 0.00001);

    // A learning candidate over a sweep, trained first, with a plot.
    let plot = dir.join("curves.svg");
    let train_file = dir.join("train.jsonl");
    let copies: Vec<String> = (0..10).map(|i| tiny(&format!("-{i}"))).collect();
    std::fs::write(&train_file, copies.join("\n")).unwrap();
    let train = train_file.display().to_string();
    let plot_arg = plot.display().to_string();
    let swept = replay(
        &dataset,
        POLICY_BANDIT,
        &[
            "--train",
            &train,
            "--sweep",
            "cost_weight=0,500",
            "--plot",
            &plot_arg,
        ],
    );
    let points = curve(&swept, "candidate")["points"]
        .as_array()
        .unwrap()
        .clone();
    let settings: Vec<&str> = points
        .iter()
        .map(|p| p["setting"].as_str().unwrap())
        .collect();
    assert_eq!(settings, ["cost_weight=0", "cost_weight=500"]);
    // At 500 per milli-dollar a cloud call (0.01 m$) costs 5 in reward,
    // more than any answer is worth: the learned policy stays local
    // except where it explores; free, it sends more.
    let share = |p: &Value| p["cloud_share"].as_f64().unwrap();
    assert!(share(&points[0]) > share(&points[1]), "{points:?}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert_eq!(
        svg.matches("<polyline").count(),
        5,
        "4 baselines + candidate"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_decision_log_flag_on_a_dataset_only_option_is_refused() {
    let dir = std::env::temp_dir().join(unique("not-a-dataset"));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log.jsonl");
    std::fs::write(&log, "").unwrap();
    let output = EDGEROUTE
        .command()
        .args(["policy", "replay"])
        .arg(&log)
        .arg(POLICY_ALWAYS_CLOUD)
        .arg("--config")
        .arg(config())
        .args(["--sweep", "x=1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("need a labelled dataset"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
