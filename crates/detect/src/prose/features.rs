//! What the prose classifier reads of a text: hashed features, grouped by
//! the unit of text they end at, so a window over the units can be scored
//! from running sums.
//!
//! - Space-separated scripts (Latin, Cyrillic, Devanagari …): each word is
//!   a unit; its features are the word, the word after the one before it,
//!   and its character 3- and 4-grams with the word's edges marked
//!   (`<diagnosed>` shares `<dia`, `diag` with `diagnosis`: one weight learnt
//!   from either form, in every language that inflects).
//! - Han, kana and Hangul, written without spaces: each character is a
//!   unit; its features are the character and the two and three
//!   characters ending at it.
//!
//! Digits read as `0` (a salary of 90 000 and one of 125 000 are the same
//! feature). Shared with `build.rs`, which trains the weights: std and
//! `fnv` only.

use std::hash::Hasher;

/// Weights in the model: features are hashed into this many buckets
/// (collisions cost a little accuracy; 2^18 f32 is 1 MiB).
pub const BUCKETS: usize = 1 << 18;

/// A text's features: `buckets[ends[i - 1]..ends[i]]` are unit `i`'s.
/// (Training in `build.rs` and tests; detection streams `for_each_unit`.)
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Default)]
pub struct Features {
    pub buckets: Vec<u32>,
    pub ends: Vec<usize>,
}

#[cfg_attr(not(test), allow(dead_code))]
impl Features {
    pub fn units(&self) -> usize {
        self.ends.len()
    }
}

/// The features of `text`, all of them (training, tests).
#[cfg_attr(not(test), allow(dead_code))]
pub fn extract(text: &str) -> Features {
    let mut out = Features::default();
    for_each_unit(text, |unit| {
        out.buckets.extend_from_slice(unit);
        out.ends.push(out.buckets.len());
    });
    out
}

/// One unit's features at a time, so scoring a large text keeps no more
/// than a running sum per unit.
struct Units<F: FnMut(&[u32])> {
    buckets: Vec<u32>,
    emit: F,
}

impl<F: FnMut(&[u32])> Units<F> {
    fn push(&mut self, bucket: u32) {
        self.buckets.push(bucket);
    }

    fn end(&mut self) {
        (self.emit)(&self.buckets);
        self.buckets.clear();
    }
}

/// Feature kinds, hashed in first so a word and a character n-gram with the
/// same bytes are different features.
const WORD: u8 = 1;
const PAIR: u8 = 2;
const GRAM: u8 = 3;
const CJK: u8 = 4;
const SHAPE: u8 = 5;

fn bucket(kind: u8, parts: &[&str]) -> u32 {
    let mut h = fnv::FnvHasher::default();
    h.write_u8(kind);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h.write_u8(0);
        }
        h.write(part.as_bytes());
    }
    (h.finish() % BUCKETS as u64) as u32
}

/// Han (and its extensions), kana and Hangul: scripts without spaces.
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30FF}'     // hiragana, katakana
        | '\u{3400}'..='\u{4DBF}'   // Han extension A
        | '\u{4E00}'..='\u{9FFF}'   // Han
        | '\u{AC00}'..='\u{D7AF}'   // Hangul
        | '\u{F900}'..='\u{FAFF}'   // Han compatibility
        | '\u{20000}'..='\u{2EBEF}' // Han extensions B–F
    )
}

/// Part of a word: letters and digits, and the combining marks of Indic
/// scripts and Latin diacritics (a virama or vowel sign is not
/// alphanumeric, but splitting a Hindi word at one would make no sense).
fn in_word(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(c, '\u{0300}'..='\u{036F}' | '\u{0900}'..='\u{0DFF}')
        || c == '\''
}

/// Calls `emit` with each unit's features, in order, for `text` (already
/// normalised by `crate::normalize`).
pub fn for_each_unit(text: &str, emit: impl FnMut(&[u32])) {
    let mut out = Units {
        buckets: Vec::with_capacity(32),
        emit,
    };
    let mut previous_word = String::new();
    let mut cjk: Vec<char> = Vec::new();
    let mut word = String::new();
    let mut scratch = Scratch::default();
    let mut sentence_start = true;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if is_cjk(c) {
            cjk_unit(&mut out, &mut cjk, c);
            previous_word.clear();
            sentence_start = false;
            continue;
        }
        if !in_word(c) {
            // Punctuation and spaces end a run of CJK (a clause) but not a
            // pair of words: "pay, and" still pairs.
            if !c.is_whitespace() && !matches!(c, ',' | '-' | '/') {
                cjk.clear();
            }
            if matches!(c, '.' | '!' | '?' | '\n' | ':' | '？' | '！' | '。' | '।') {
                sentence_start = true;
            }
            // A question mark is a unit of its own: a general question
            // about a topic reads differently from a statement.
            if matches!(c, '?' | '？') {
                out.push(bucket(SHAPE, &["?"]));
                out.end();
            }
            continue;
        }
        // A capital inside a sentence: most often a name, and a named
        // person or company is what makes a fact private.
        let named = !sentence_start && c.is_uppercase();
        sentence_start = false;
        word.clear();
        let mut push = |c: char| {
            for c in c.to_lowercase() {
                word.push(if c.is_ascii_digit() { '0' } else { c });
            }
        };
        push(c);
        while let Some(&next) = chars.peek() {
            if !in_word(next) || is_cjk(next) {
                break;
            }
            push(next);
            chars.next();
        }
        let trimmed = word.trim_matches('\'');
        if trimmed.is_empty() {
            continue;
        }
        cjk.clear();
        if named {
            out.push(bucket(SHAPE, &["name"]));
        }
        word_unit(&mut out, &previous_word, trimmed, &mut scratch);
        previous_word.clear();
        previous_word.push_str(trimmed);
    }
}

/// Buffers a text's words reuse.
#[derive(Default)]
struct Scratch {
    padded: String,
    starts: Vec<usize>,
}

fn word_unit<F: FnMut(&[u32])>(
    out: &mut Units<F>,
    previous: &str,
    word: &str,
    scratch: &mut Scratch,
) {
    let Scratch { padded, starts } = scratch;
    out.push(bucket(WORD, &[word]));
    if !previous.is_empty() {
        out.push(bucket(PAIR, &[previous, word]));
    }
    padded.clear();
    padded.push('<');
    padded.push_str(word);
    padded.push('>');
    starts.clear();
    starts.extend(padded.char_indices().map(|(i, _)| i).chain([padded.len()]));
    for n in 3..=4 {
        for w in starts.windows(n + 1) {
            out.push(bucket(GRAM, &[&padded[w[0]..w[n]]]));
        }
    }
    out.end();
}

fn cjk_unit<F: FnMut(&[u32])>(out: &mut Units<F>, run: &mut Vec<char>, c: char) {
    // Only the last three characters make grams: a long run stays small.
    if run.len() == 3 {
        run.remove(0);
    }
    run.push(c);
    let mut utf8 = [0_u8; 12];
    for n in 1..=run.len() {
        let mut len = 0;
        for ch in &run[run.len() - n..] {
            len += ch.encode_utf8(&mut utf8[len..]).len();
        }
        let gram = std::str::from_utf8(&utf8[..len]).unwrap_or_default();
        out.push(bucket(CJK, &[gram]));
    }
    out.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pairs_and_grams_per_unit() {
        let f = extract("Got diagnosed");
        assert_eq!(f.units(), 2);
        // "got": word + grams of "<got>": 3 of three characters, 2 of four.
        assert_eq!(f.ends[0], 6);
        // "diagnosed": word + pair + grams of an 11-char padded word.
        assert_eq!(f.ends[1] - f.ends[0], 2 + 9 + 8);
        // Inflections share grams; digits fold.
        let a = extract("diagnosed");
        let b = extract("diagnosis");
        let shared = a.buckets.iter().filter(|x| b.buckets.contains(x)).count();
        assert!(shared >= 4, "{shared}");
        assert_eq!(extract("90 000 €").buckets, extract("12 345 €").buckets);
    }

    #[test]
    fn cjk_characters_are_units() {
        let f = extract("他确诊了。HR");
        // 他 确 诊 了 then the word "hr".
        assert_eq!(f.units(), 5);
        assert_eq!(f.ends[0], 1);
        assert_eq!(f.ends[1], 3);
        assert_eq!(f.ends[2], 6);
        // Full stop ends the clause: 诊了 is a bigram, but nothing spans "。".
        let hindi = extract("डिप्रेशन है");
        assert_eq!(hindi.units(), 2, "a virama does not split a word");
    }

    #[test]
    fn names_and_questions_are_features() {
        // A capital inside a sentence adds one feature; at its start none.
        let named = extract("ask Anna");
        let plain = extract("ask anna");
        assert_eq!(named.buckets.len(), plain.buckets.len() + 1);
        assert_eq!(extract("Anna").buckets, extract("anna").buckets);
        // A question mark is a unit.
        assert_eq!(extract("why?").units(), 2);
        assert_eq!(extract("why").units(), 1);
    }
}
