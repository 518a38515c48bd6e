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

/// A text is scored by windows of these many units (words, or CJK
/// characters): a few sentences, so a short confidential passage inside a
/// long clean prompt is not diluted by the words around it, and not so few
/// that a clean text's every phrase gets its own chance to look
/// confidential. (Measured by the cross-validation test: [32, 64] and
/// [40, 80] ranked no better and cost more windows; [64] alone found
/// fewer passages pasted into long texts.)
pub const WINDOWS: [usize; 1] = [48];
/// Windows end every `STEP` units (each size once it is full) and at the
/// end of the text; a text shorter than a size is that size's one window.
pub const STEP: usize = 16;

/// The windows of a text of `units` units, as unit ranges, in the order
/// the classifier scores them (training scores the same ones).
pub fn windows(units: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for end in (STEP..=units).step_by(STEP) {
        for size in WINDOWS {
            if end >= size {
                out.push((end - size, end));
            }
        }
    }
    if units > 0 {
        for size in WINDOWS {
            let window = (units.saturating_sub(size), units);
            if !out.contains(&window) {
                out.push(window);
            }
        }
    }
    out
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
/// alphanumeric, but splitting a Hindi word at one would make no sense) —
/// not the danda and double danda, Devanagari's full stops.
fn in_word(c: char) -> bool {
    c.is_alphanumeric()
        || (matches!(c, '\u{0300}'..='\u{036F}' | '\u{0900}'..='\u{0DFF}')
            && !matches!(c, '\u{0964}' | '\u{0965}'))
        || c == '\''
}

/// Characters of a word its features read: a longer "word" (a blob of
/// base64, a paragraph in a script without spaces) counts as its start and
/// a shape feature, so no single unit outweighs a window.
const MAX_WORD_CHARS: usize = 32;

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
            // Punctuation other than a comma, dash or slash ends a run of
            // CJK (a clause; spaces do not: such text is often spaced),
            // never a pair of words ("pay, and" still pairs). Full-width
            // punctuation is ASCII by now (NFKC), bar the ideographic
            // full stop.
            if !c.is_whitespace() && !matches!(c, ',' | '-' | '/') {
                cjk.clear();
            }
            if matches!(c, '.' | '!' | '?' | '\n' | ':' | '。' | '।' | '॥') {
                sentence_start = true;
            }
            // A question mark is a unit of its own: a general question
            // about a topic reads differently from a statement.
            if c == '?' {
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
        let mut chars_in_word = 0;
        let mut push = |c: char| {
            chars_in_word += 1;
            if chars_in_word > MAX_WORD_CHARS {
                return;
            }
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
        if chars_in_word > MAX_WORD_CHARS {
            out.push(bucket(SHAPE, &["long"]));
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
        // A danda is a full stop, not part of the word before it.
        assert_eq!(extract("है।").buckets, extract("है").buckets);
        // Nothing spans the ideographic full stop: 了 then 他 share no
        // bigram, but without it they do.
        assert!(extract("了。他").buckets.len() < extract("了他").buckets.len());
    }

    #[test]
    fn a_huge_word_is_a_bounded_unit() {
        let blob = "a".repeat(1 << 20);
        let f = extract(&blob);
        assert_eq!(f.units(), 1);
        // The word, its first 32 characters' grams and the shape feature.
        assert!(f.buckets.len() < 80, "{}", f.buckets.len());
    }

    #[test]
    fn windows_cover_every_unit_and_short_texts_are_one() {
        assert_eq!(windows(0), vec![]);
        assert_eq!(windows(20), vec![(0, 20)]);
        let longest = WINDOWS[WINDOWS.len() - 1];
        for n in [33, 47, 48, 49, 64, 65, 97, 300] {
            let w = windows(n);
            assert!(
                (0..n).all(|u| w.iter().any(|&(a, b)| a <= u && u < b)),
                "{n}"
            );
            assert!(w.iter().all(|&(a, b)| b - a <= longest && b <= n), "{n}");
            // Consecutive windows start STEP apart or less.
            assert!(w.windows(2).all(|p| p[1].0.abs_diff(p[0].0) <= STEP), "{n}");
        }
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
