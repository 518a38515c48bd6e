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
//! 128-token text ~98 ms on one core); the n-gram model costs
//! microseconds and reads every language the same way.

pub mod classifier;
pub mod features;
pub mod lexicon;
pub mod train;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize;

    /// Each unit's summed weights and feature count under a model's
    /// `weight`s (the model trained on the other folds).
    fn units_of(f: &features::Features, weight: impl Fn(usize) -> f32) -> Vec<(f32, u32)> {
        let mut start = 0;
        f.ends
            .iter()
            .map(|&end| {
                let sum = f.buckets[start..end]
                    .iter()
                    .map(|&b| weight(b as usize))
                    .sum();
                let count = (end - start) as u32;
                start = end;
                (sum, count)
            })
            .collect()
    }

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

    /// Five-fold cross-validation on the training texts: each fifth scored
    /// by a model trained on the other four, as the node scores a text
    /// (normalised, by windows). What it prints is the estimate the README
    /// quotes; the bars catch a broken feature or trainer.
    #[test]
    fn the_classifier_generalises_across_folds() {
        let texts = training_texts();
        let features: Vec<_> = texts
            .iter()
            .map(|(t, c)| (features::extract(&normalize(t)), *c))
            .collect();
        let (mut tp, mut positives, mut fp, mut negatives) = (0, 0, 0, 0);
        for fold in 0..5 {
            let examples: Vec<_> = features
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 5 != fold)
                .map(|(_, (f, c))| train::Example::new(f, *c))
                .collect();
            let model = train::train(&examples);
            for (_, (f, confidential)) in features.iter().enumerate().filter(|(i, _)| i % 5 == fold)
            {
                let units = units_of(f, |b| model.weights[b]);
                let p = train::sigmoid(classifier::best_logit(&units, model.bias));
                let found = p >= crate::Settings::default().prose_classifier_threshold;
                if *confidential {
                    positives += 1;
                    tp += found as usize;
                } else {
                    negatives += 1;
                    fp += found as usize;
                }
            }
        }
        let (recall, fpr) = (tp as f64 / positives as f64, fp as f64 / negatives as f64);
        println!(
            "5-fold: recall {tp}/{positives} = {recall:.3}, false positives {fp}/{negatives} = {fpr:.3}"
        );
        assert!(
            recall >= 0.75 && fpr <= 0.08,
            "recall {recall:.3}, false positives {fpr:.3}"
        );
    }

    /// Phrasings no list holds, found by the built model at the default
    /// threshold (the second is the end-to-end test's prompt, canary and
    /// all); everyday questions are not.
    #[test]
    fn the_built_model_reads_phrasings_the_lexicon_does_not() {
        let threshold = crate::Settings::default().prose_classifier_threshold;
        for text in [
            "We're letting Tom go on Friday, HR has the paperwork ready.",
            "canary-prose-5f1c2a Between us: Marta is expecting and will tell the team after her first scan, so quietly move her site visits to Tom.",
        ] {
            assert_eq!(lexicon::score(text), 0.0, "{text}");
            let p = classifier::probability(&normalize(text));
            assert!(p >= threshold, "{p}: {text}");
        }
        for text in [
            "How do I reverse a linked list in Rust?",
            "What are common symptoms of the flu?",
            "Suggest a name for a bakery.",
            "who directed",
        ] {
            let p = classifier::probability(&normalize(text));
            assert!(p < threshold, "{p}: {text}");
        }
    }
}
