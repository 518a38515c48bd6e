//! What a text must hold for a rule to match it, read from the rule's
//! syntax trees: at least as many ASCII digits as any match holds, and its
//! context words somewhere. A text without them is not searched by it.
//!
//! Why: most rules are numbers (cards, national IDs, phones, IBANs) or
//! need a word before the value (a passport number is any 6–9 letters and
//! digits after "passport"), and most prompts have few digits and none of
//! those words. On the node, each search of a short text costs far more
//! than its length suggests: the rest of a request (the HTTP stack,
//! wasmtime, the fetcher's memory reset) has pushed the rules' automata
//! out of the caches, so every rule searched is a round of cache misses.
//! Skipping the rules a text cannot match is exact (no detection changes)
//! and cheap (one pass counting digits; context words have a literal
//! prefilter).
//!
//! The tree is parsed by `regex-syntax` with its defaults, which are the
//! regex crate's (it is the crate's own parser, the same version in every
//! lock file): the tree analysed is the tree that runs.
//!
//! Exact because both are necessary conditions. The digit count is a
//! lower bound: a class counts as a digit only when every character it
//! holds is one (`[0-9]`, not `[0-9a-f]` nor Unicode `\d`), an alternation
//! takes its smallest branch, a repetition its minimum, and anything
//! unknown counts as none. Context words that match before a value match
//! in the whole text only when they hold no assertion (`\b`, `^`, `$`),
//! which could hold at the edge of the part before the value and not in
//! the whole text: words with one are not used to skip.

use regex_syntax::hir::{Class, Hir, HirKind};

/// The fewest ASCII digits in any match of `pattern`; 0 for a pattern
/// that does not parse (it is then always searched, and fails to compile
/// where it is compiled).
pub fn min_digits(pattern: &str) -> usize {
    regex_syntax::Parser::new()
        .parse(pattern)
        .map_or(0, |hir| floor(&hir))
}

fn floor(hir: &Hir) -> usize {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => 0,
        HirKind::Literal(literal) => literal.0.iter().filter(|b| b.is_ascii_digit()).count(),
        HirKind::Class(class) => usize::from(only_digits(class)),
        HirKind::Repetition(repetition) => {
            (repetition.min as usize).saturating_mul(floor(&repetition.sub))
        }
        HirKind::Capture(capture) => floor(&capture.sub),
        HirKind::Concat(parts) => parts.iter().map(floor).fold(0, usize::saturating_add),
        HirKind::Alternation(branches) => branches.iter().map(floor).min().unwrap_or(0),
    }
}

/// Every character of `class` is an ASCII digit (an empty class matches
/// nothing, so it counts as none: the bound stays a lower one).
fn only_digits(class: &Class) -> bool {
    match class {
        Class::Unicode(class) => {
            let mut ranges = class.ranges().iter().peekable();
            ranges.peek().is_some()
                && ranges.all(|r| r.start().is_ascii_digit() && r.end().is_ascii_digit())
        }
        Class::Bytes(class) => {
            let mut ranges = class.ranges().iter().peekable();
            ranges.peek().is_some()
                && ranges.all(|r| r.start().is_ascii_digit() && r.end().is_ascii_digit())
        }
    }
}

/// `pattern` parses and holds no assertion: whatever it matches inside a
/// part of a text, it matches in the whole text.
pub fn assertion_free(pattern: &str) -> bool {
    regex_syntax::Parser::new()
        .parse(pattern)
        .is_ok_and(|hir| hir.properties().look_set().is_empty())
}

/// The ASCII digits in `text`.
pub fn count(text: &str) -> usize {
    text.bytes().filter(u8::is_ascii_digit).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_digits_every_match_must_hold() {
        assert_eq!(min_digits(r"[0-9]{3}-[0-9]{2}-[0-9]{4}"), 9);
        assert_eq!(
            min_digits(r"(?:^|[^0-9A-Za-z])([0-9](?:[ .\-]?[0-9]){12,18})"),
            13
        );
        // The smallest branch; a literal's own digits.
        assert_eq!(min_digits(r"AKIA[0-9]{16}|ghp_[A-Za-z0-9]{36}"), 0);
        assert_eq!(min_digits(r"(?:DE|AT)[0-9]{9}|NL[0-9]{9}B[0-9]{2}"), 9);
        assert_eq!(min_digits(r"D6W|[0-9]{2}"), 1);
        assert_eq!(min_digits(r"x1y22"), 3);
        // A class with anything but digits in it counts as none.
        assert_eq!(min_digits(r"[0-9a-f]{32}"), 0);
        assert_eq!(min_digits(r"\d{5}"), 0, "Unicode \\d is not only ASCII");
        assert_eq!(min_digits(r"(?-u:\d){5}"), 5);
        assert_eq!(min_digits(r"(?i)password"), 0);
        assert_eq!(min_digits(r"(?i)1"), 1);
        assert_eq!(min_digits(r"[[:digit:]]{3}"), 3);
        assert_eq!(min_digits(r"(?-u:[0-9]){2}"), 2);
        assert_eq!(min_digits(r"[0-9&&\d]{4}"), 4);
        assert_eq!(min_digits(r"(1|)x"), 0);
        assert_eq!(min_digits(r"1{0}x"), 0);
        // Optional and unbounded parts.
        assert_eq!(min_digits(r"[0-9]?[0-9]*[0-9]+"), 1);
        // Does not parse: always searched.
        assert_eq!(min_digits(r"[0-9"), 0);
    }

    #[test]
    fn words_with_an_assertion_are_not_free_of_one() {
        assert!(assertion_free(r"(?i)(?:passport|reisepass|护照)"));
        assert!(!assertion_free(r"(?i)(?:phone|\bmobil\b)"));
        assert!(!assertion_free(r"^born"));
        assert!(!assertion_free(r"(?:born"), "does not parse");
    }

    #[test]
    fn counts_ascii_digits_only() {
        assert_eq!(count("card 4111 1111, ref ١٢٣ ４"), 8);
    }
}
