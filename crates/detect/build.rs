//! Trains the prose classifier on `prose-train/*.jsonl` (see
//! `src/prose/train.rs`) and writes its weights to `OUT_DIR`, where
//! `src/prose/classifier.rs` includes them. The same modules the crate
//! uses, so training and detection read a text the same way.

#![allow(dead_code)]

#[path = "src/prose/features.rs"]
mod features;
#[path = "src/prose/lexicon.rs"]
mod lexicon;
#[path = "src/normalize.rs"]
mod normalize;
#[path = "src/prose/train.rs"]
mod train;

use std::path::Path;

fn main() {
    // Read when the script runs, not baked in when it is compiled: a target
    // folder shared by several checkouts reuses this script's binary, and a
    // compiled-in path would train on (or fail to find) another checkout.
    let dir = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .join("prose-train");
    println!("cargo::rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a training file").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    // Directory order differs between file systems; the weights must not.
    files.sort();
    let mut examples = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (text, confidential) in
            train::read(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        {
            // Read as the detector reads a text: normalised, without the
            // phrases that only look confidential.
            let text = lexicon::without_look_alikes(&normalize::normalize(&text)).into_owned();
            examples.extend(train::examples(&features::extract(&text), confidential));
        }
    }
    assert!(
        examples.len() > 100,
        "too few training texts in {}",
        dir.display()
    );
    let model = train::train(&examples);
    let mut bytes = Vec::with_capacity(4 * (model.weights.len() + 1));
    bytes.extend(model.bias.to_le_bytes());
    for w in &model.weights {
        bytes.extend(w.to_le_bytes());
    }
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("prose-model.bin");
    std::fs::write(&out, bytes).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
