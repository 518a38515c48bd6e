//! Confidential prose: text with no identifier in it that still must not
//! leave (a diagnosis, a salary, a lawsuit, an unannounced deal, a
//! "confidential" marking). Two detectors, either one enough:
//!
//! - `lexicon`: weighted words and markings in several languages, summed
//!   against `[guard] prose_threshold` — it knows the markings exactly;
//! - `classifier`: logistic regression over hashed words and character
//!   n-grams (`features`), trained at build time (`train`) on the labelled
//!   texts in `crates/detect/prose-train/`, against `[guard]
//!   prose_classifier_threshold` — it generalises to phrasings no list
//!   holds ("she's expecting", "managed out").
//!
//! Why not a classifier on the embedding model: detection runs on every
//! request whatever the policy, and an embedding costs milliseconds (a
//! 16-token text ~8 ms, 128 tokens ~53 ms on one core) and MiniLM reads
//! English; the n-gram model costs tens of microseconds and reads every
//! language the same way.

pub mod classifier;
pub mod features;
pub mod lexicon;
pub mod train;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize;

    fn training_texts() -> Vec<(String, bool)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/prose-train");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        files
            .iter()
            .flat_map(|f| train::read(&std::fs::read_to_string(f).unwrap()).unwrap())
            .collect()
    }

    /// A text as the detector reads it.
    fn prepared(text: &str) -> String {
        lexicon::without_look_alikes(&normalize(text)).into_owned()
    }

    /// Five-fold cross-validation on the training texts: each fifth scored
    /// by a model trained on the other four, as the node scores a text
    /// (prepared, by windows); and each held-out confidential text pasted
    /// into the middle of a long held-out clean one (at least 100 units),
    /// where the windows must still find it. What it prints is the
    /// estimate the README quotes; the bars catch a broken feature,
    /// window or trainer.
    #[test]
    fn the_classifier_generalises_across_folds() {
        let threshold = crate::Settings::default().prose_classifier_threshold;
        let texts: Vec<(String, bool)> = training_texts()
            .into_iter()
            .map(|(t, c)| (prepared(&t), c))
            .collect();
        let features: Vec<_> = texts.iter().map(|(t, _)| features::extract(t)).collect();
        // (probability, confidential) of each held-out text, and of each
        // confidential one pasted into a long clean one.
        let (mut alone, mut pasted) = (Vec::new(), Vec::new());
        for fold in 0..5 {
            let examples: Vec<_> = (0..texts.len())
                .filter(|i| i % 5 != fold)
                .flat_map(|i| train::examples(&features[i], texts[i].1))
                .collect();
            let model = train::train(&examples);
            let probability = |text: &str| {
                train::sigmoid(classifier::best_logit(text, model.bias, |b| {
                    model.weights[b]
                }))
            };
            let held: Vec<usize> = (0..texts.len()).filter(|i| i % 5 == fold).collect();
            let long: Vec<&str> = held
                .iter()
                .filter(|&&i| !texts[i].1 && features[i].units() >= 100)
                .map(|&i| texts[i].0.as_str())
                .collect();
            for &i in &held {
                let (text, confidential) = (&texts[i].0, texts[i].1);
                alone.push((probability(text), confidential));
                if confidential {
                    let host = long[i % long.len()];
                    let half = host.floor_char_boundary(host.len() / 2);
                    let middle = host[..half].rfind(' ').unwrap_or(half);
                    let inserted = format!("{} {text} {}", &host[..middle], &host[middle..]);
                    pasted.push(probability(&inserted));
                }
            }
        }
        let share =
            |of: &[f32], at: f32| of.iter().filter(|&&p| p >= at).count() as f64 / of.len() as f64;
        let (mut clean, mut secret): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
        for &(p, confidential) in &alone {
            if confidential {
                secret.push(p)
            } else {
                clean.push(p)
            }
        }
        let (recall, fpr, inside) = (
            share(&secret, threshold),
            share(&clean, threshold),
            share(&pasted, threshold),
        );
        // The threshold that flags 5 % of the clean texts and its recall:
        // how well the model ranks, whatever the default threshold.
        clean.sort_by(f32::total_cmp);
        let at = clean[clean.len() * 95 / 100];
        println!(
            "5-fold, {} confidential and {} clean texts: at {threshold}, recall {recall:.3}, false positives {fpr:.3}, found pasted inside a long clean text {inside:.3}; at 5 % false positives (threshold {at:.3}) recall {:.3}, pasted {:.3}",
            secret.len(),
            clean.len(),
            share(&secret, at.next_up()),
            share(&pasted, at.next_up())
        );
        assert!(
            recall >= 0.7 && fpr <= 0.08 && inside >= 0.5,
            "recall {recall:.3}, false positives {fpr:.3}, inside {inside:.3}"
        );
    }

    /// The stream the node scores and the windows training reads are the
    /// same windows: for texts of many lengths, the streamed best equals
    /// the best of `features::windows` computed from all the features.
    #[test]
    fn the_scored_windows_are_the_trained_windows() {
        let weight = |b: usize| ((b as u64 * 2_654_435_761) % 1000) as f32 / 1000.0 - 0.5;
        for words in [0, 1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 250] {
            let text: String = (0..words)
                .map(|i| format!("w{} ", i * 7919 % 1013))
                .collect();
            let f = features::extract(&text);
            assert_eq!(f.units(), words);
            let expected = features::windows(f.units())
                .into_iter()
                .map(|(from, to)| {
                    let start = if from == 0 { 0 } else { f.ends[from - 1] };
                    let window = &f.buckets[start..f.ends[to - 1]];
                    let sum: f64 = window.iter().map(|&b| f64::from(weight(b as usize))).sum();
                    0.25 + sum as f32 * train::scale(window.len())
                })
                .fold(f32::NEG_INFINITY, f32::max);
            let streamed = classifier::best_logit(&text, 0.25, weight);
            assert!(
                (streamed - expected).abs() < 1e-4 || streamed == expected,
                "{words} words: {streamed} vs {expected}"
            );
        }
    }

    /// Phrasings no list holds, found by the built model at the default
    /// threshold; everyday questions are not.
    #[test]
    fn the_built_model_reads_phrasings_the_lexicon_does_not() {
        let threshold = crate::Settings::default().prose_classifier_threshold;
        for text in [
            "We're letting Tom go on Friday, HR has the paperwork ready.",
            E2E_PROSE,
        ] {
            assert_eq!(lexicon::score(text), 0.0, "{text}");
            let p = classifier::probability(&prepared(text));
            assert!(p >= threshold, "{p}: {text}");
        }
        for text in [
            "How do I reverse a linked list in Rust?",
            "What are common symptoms of the flu?",
            "Suggest a name for a bakery.",
            "who directed",
        ] {
            let p = classifier::probability(&prepared(text));
            assert!(p < threshold, "{p}: {text}");
        }
    }

    /// The end-to-end test's prompt (`tests/e2e/chat.rs`).
    const E2E_PROSE: &str = "Please keep this to yourself: Marta is expecting and hasn't told anyone at work yet, so quietly move her site visits to Tom until she announces it.";

    /// That test puts a random canary word before the prompt
    /// (`edgeroute_testkit::unique`: letters a–z in three groups); no
    /// canary of that shape may tip the prompt under the threshold, or the
    /// test would fail by chance.
    #[test]
    fn the_end_to_end_prompt_is_found_whatever_its_canary() {
        let threshold = crate::Settings::default().prose_classifier_threshold;
        let letters = edgeroute_testkit::letters;
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let mut lowest = f32::INFINITY;
        for n in 0..500 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let canary = format!(
                "canary-prose-{}-{}-{}",
                letters(seed % 4_000_000),
                letters(n),
                letters(seed >> 34)
            );
            let p = classifier::probability(&prepared(&format!("{canary} {E2E_PROSE}")));
            lowest = lowest.min(p);
        }
        println!(
            "lowest {lowest}, without a canary {}",
            classifier::probability(&prepared(E2E_PROSE))
        );
        assert!(lowest >= threshold + 0.05, "lowest {lowest}");
    }
}
