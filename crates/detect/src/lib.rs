//! What sensitive data a request holds, by kind (never the text): the
//! structured identifiers and secrets of `rules` (confirmed by `validate`
//! where a checksum or format rule exists), the operator's own patterns,
//! and confidential prose (`prose`). Text is normalised first
//! (`normalize`), every message is scanned on its own and all of them
//! joined (a card number split across two turns is still one number), and
//! the operator's allow-list removes what is known to be harmless.
//!
//! A false positive keeps a request on the node; a false negative could
//! send it out. The evaluation set (`tests/detection/`) measures both.
//!
//! Its own crate, with no wasmtime, HTTP or llama.cpp, so that the node and
//! the Spin gateway component (`components/spin-gateway`, wasm32-wasip2)
//! judge a request with the same code: `body` reads a request strictly,
//! `collect` gathers every declared and detected level.

pub mod body;
pub mod collect;
pub mod eval;
mod must_hold;
mod normalize;
mod prose;
mod rules;
mod validate;

pub use normalize::normalize;

use regex::Regex;
use rules::{CONTEXT_CHARS, Rule};
use serde::Deserialize;
use std::collections::BTreeSet;

/// A text judged by itself ([`Detector::alone`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alone {
    /// Normalised, the operator's allow list applied: what is joined.
    pub prepared: String,
    /// What it holds by itself, sorted; empty for a clean text.
    pub kinds: Vec<&'static str>,
}

/// The kind prose detection reports.
pub const CONFIDENTIAL: &str = "confidential";

/// An operator's own detector (`[guard] patterns`): a kind and a regex.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pattern {
    /// The kind reported (reason header, decision log), e.g. `employee-id`.
    pub kind: String,
    pub regex: String,
}

/// What an operator adds to the built-in rules (`[guard]` in the node's
/// config, Spin variables in the gateway).
#[derive(Debug, Clone)]
pub struct Settings<'a> {
    pub patterns: &'a [Pattern],
    /// Regexes of text known to be harmless, removed before detection.
    pub allow: &'a [String],
    /// Confidential prose scores at or above this are found (the lexicon).
    pub prose_threshold: f32,
    /// Text the prose classifier gives at least this probability is
    /// confidential; 1 turns the classifier off.
    pub prose_classifier_threshold: f32,
}

impl Default for Settings<'_> {
    fn default() -> Self {
        Self {
            patterns: &[],
            allow: &[],
            prose_threshold: 1.0,
            prose_classifier_threshold: 0.37,
        }
    }
}

pub struct Detector {
    rules: Vec<Rule>,
    allow: Vec<Regex>,
    prose_threshold: f32,
    prose_classifier_threshold: f32,
}

impl Detector {
    /// The built-in rules plus the operator's patterns, minus its allow
    /// list; an error names the regex that does not compile.
    pub fn new(settings: &Settings) -> Result<Self, String> {
        let builtin = Self {
            rules: rules::builtin(),
            allow: Vec::new(),
            prose_threshold: Settings::default().prose_threshold,
            prose_classifier_threshold: Settings::default().prose_classifier_threshold,
        };
        builtin.with(settings)
    }

    /// This detector's rules plus the operator's patterns, with the
    /// operator's allow list and prose threshold in place of its own. Only
    /// the operator's regexes are compiled (the rest are shared): the Spin
    /// gateway keeps the built-in rules compiled in its snapshot and adds
    /// an operator's per request.
    pub fn with(&self, settings: &Settings) -> Result<Self, String> {
        let mut rules = self.rules.clone();
        for p in settings.patterns {
            let pattern =
                Regex::new(&p.regex).map_err(|e| format!("[guard] pattern '{}': {e}", p.kind))?;
            // Operator kinds live as long as the detector's process (the
            // node) or instance (a Spin request).
            let kind: &'static str = Box::leak(p.kind.clone().into_boxed_str());
            rules.push(Rule::new(kind, pattern, None));
        }
        let allow = settings
            .allow
            .iter()
            .map(|a| Regex::new(a).map_err(|e| format!("[guard] allow '{a}': {e}")))
            .collect::<Result<_, _>>()?;
        // The skip's facts are derived from the patterns when a rule is
        // made; a rule changed after that must have them made again.
        debug_assert!(rules.iter().all(|r| {
            r.min_digits == must_hold::min_digits(r.pattern.as_str())
                && r.context_anywhere
                    == r.context
                        .as_ref()
                        .is_some_and(|c| must_hold::assertion_free(c.as_str()))
        }));
        Ok(Self {
            rules,
            allow,
            prose_threshold: settings.prose_threshold,
            prose_classifier_threshold: settings.prose_classifier_threshold,
        })
    }

    /// The kinds found in these texts (each alone, and all joined), sorted.
    pub fn scan<'a>(&self, texts: impl IntoIterator<Item = &'a str>) -> Vec<&'static str> {
        self.scan_each(texts.into_iter().map(|text| self.alone(text)))
    }

    /// What `text` holds by itself: its prepared form and the kinds the
    /// rules and the classifier find in it alone. A pure function of the
    /// text (and this detector), so a caller may remember it for a text
    /// that comes again, as an agent's tool schemas do on every call.
    pub fn alone(&self, text: &str) -> Alone {
        let prepared = self.prepare(text);
        let mut found = BTreeSet::new();
        self.scan_one(&prepared, &mut found);
        self.scan_broken_lines(&prepared, &mut found);
        // Each text alone: the classifier reads passages, and one spanning
        // two turns is no more confidential than its parts.
        if !found.contains(CONFIDENTIAL) && self.classifier_finds(&prepared) {
            found.insert(CONFIDENTIAL);
        }
        Alone {
            prepared,
            kinds: found.into_iter().collect(),
        }
    }

    /// [`Detector::scan`] of texts already judged alone (by
    /// [`Detector::alone`], or remembered from it): their kinds, and what
    /// only all of them joined hold.
    pub fn scan_each(&self, texts: impl IntoIterator<Item = Alone>) -> Vec<&'static str> {
        let mut found = BTreeSet::new();
        let texts: Vec<String> = texts
            .into_iter()
            .map(|alone| {
                found.extend(alone.kinds);
                alone.prepared
            })
            .collect();
        if texts.len() > 1 {
            // A value split across turns: joined with a space, which every
            // number pattern takes as a separator.
            let joined = texts.join(" ");
            self.scan_one(&joined, &mut found);
            // A card number typed in parts with words between them ("it
            // starts 4111 1111", "and ends 1111 1111"): consecutive runs of
            // digits across the texts, whatever is written around them.
            for kind in split_numbers(&texts, &joined) {
                found.insert(kind);
            }
            if !found.contains("phone") && split_phone(&texts) {
                found.insert("phone");
            }
            // A value typed in two parts with the assistant's turn between
            // them ("my sister's number is 07700", "what's the rest?", "900
            // 224"): the end of each text joined to the start of the one
            // after next. Only the rules: the joined text above already
            // gave the lexicon every word. Every value split so has a digit
            // on one side at least (a number's parts, a date after "my date
            // of birth is"): a seam without is not searched, as most of an
            // agent's are not.
            for turns in texts.windows(3) {
                let (end, start) = (last_chars(&turns[0], SEAM_CHARS), head(&turns[2]));
                let digit = |s: &str| s.bytes().any(|b| b.is_ascii_digit());
                let with_digit = digit(end) || digit(start);
                if with_digit {
                    self.scan_rules(&format!("{end} {start}"), &mut found);
                }
                // A token cut in two ("ghp_zXe3…" and "DhW3…"), and an
                // address cut anywhere ("tanaka.k" and "@example.com"; cut
                // at its '@' it may hold no digit at all): the parts glued,
                // for the kinds that are one unbroken token.
                let (end, start) = (end.trim_end(), start.trim_start());
                let token = |c: Option<char>| {
                    c.is_some_and(|c| c.is_ascii_alphanumeric() || "_-.@".contains(c))
                };
                let cut_token =
                    with_digit && token(end.chars().last()) && token(start.chars().next());
                let cut_address = end.ends_with('@') || start.starts_with('@');
                // A password too, where the seam reads as one cut: at a
                // hyphen or a symbol ("Walnut", "-Kettle-22"), or after a
                // capitalised part ("Copper", "Fox91") — not "my password
                // be" and "16 enough?".
                let last_word = end.rsplit(char::is_whitespace).next().unwrap_or("");
                let cut_password = cut_token
                    && (end.ends_with(['-', '_'])
                        || start.starts_with(['-', '_', '.', '!', '#', '@'])
                        || last_word.starts_with(|c: char| c.is_uppercase()));
                if cut_token || cut_address {
                    self.scan_kinds(&format!("{end}{start}"), &mut found, |kind| {
                        kind == "email"
                            || (cut_token && matches!(kind, "api-key" | "jwt"))
                            || (cut_password && kind == "password")
                    });
                }
            }
        }
        found.into_iter().collect()
    }

    fn classifier_finds(&self, text: &str) -> bool {
        self.prose_classifier_threshold < 1.0
            && prose::classifier::probability(&prose::lexicon::without_look_alikes(text))
                >= self.prose_classifier_threshold
    }

    fn prepare(&self, text: &str) -> String {
        let mut text = normalize(text);
        for allow in &self.allow {
            text = allow.replace_all(&text, " ").into_owned();
        }
        text
    }

    fn scan_one(&self, text: &str, found: &mut BTreeSet<&'static str>) {
        self.scan_rules(text, found);
        if !found.contains(CONFIDENTIAL) && prose::lexicon::score(text) >= self.prose_threshold {
            found.insert(CONFIDENTIAL);
        }
    }

    /// A number a PDF's or a scan's copy broke over lines ("4111 1111\n
    /// 1111 1111", "5764\n1242\n4368"): the text once more with each line
    /// break between two digits made a space, for the kinds a check
    /// confirms, and once with it taken out for a resident ID, which is
    /// written solid ("3201021991\n0726713X"). A card and an Aadhaar, whose
    /// checks pass one number in ten, only where the text names them: a
    /// column of years is no card.
    fn scan_broken_lines(&self, text: &str, found: &mut BTreeSet<&'static str>) {
        let Some(spaced) = join_broken_numbers(text, " ") else {
            return;
        };
        self.scan_kinds(&spaced, found, |kind| match kind {
            "iban" | "uk-nino" | "us-ssn" | "nhs-number" => true,
            "payment-card" => CARD_WORDS.is_match(text),
            "in-aadhaar" => AADHAAR_WORDS.is_match(text),
            _ => false,
        });
        if !found.contains("cn-resident-id")
            && let Some(solid) = join_broken_numbers(text, "")
        {
            self.scan_kinds(&solid, found, |kind| kind == "cn-resident-id");
        }
    }

    /// The rules of the kinds `wanted` takes, over `text`.
    fn scan_kinds(
        &self,
        text: &str,
        found: &mut BTreeSet<&'static str>,
        wanted: impl Fn(&str) -> bool,
    ) {
        for rule in &self.rules {
            if !found.contains(rule.kind) && wanted(rule.kind) && matches(rule, text) {
                found.insert(rule.kind);
            }
        }
    }

    fn scan_rules(&self, text: &str, found: &mut BTreeSet<&'static str>) {
        let digits = must_hold::count(text);
        for rule in &self.rules {
            if rule.min_digits > digits || found.contains(rule.kind) {
                continue;
            }
            // Without its words anywhere, no candidate of this rule can be
            // confirmed: it is not searched (nor, in a text of thousands of
            // look-alikes, reported by the candidate cap of `matches`).
            if rule.context_anywhere
                && let Some(words) = &rule.context
                && !words.is_match(text)
            {
                continue;
            }
            if matches(rule, text) {
                found.insert(rule.kind);
            }
        }
    }
}

/// How much of a text's end and the start of the text after next are
/// joined to find a value typed across an assistant's turn: a value's
/// parts and the words before them that give their context
/// ([`rules::CONTEXT_CHARS`]).
const SEAM_CHARS: usize = 96;

/// The last `n` characters of `text` (all of it when shorter).
fn last_chars(text: &str, n: usize) -> &str {
    let start = text.char_indices().rev().nth(n - 1).map_or(0, |(i, _)| i);
    &text[start..]
}

fn head(text: &str) -> &str {
    let end = text
        .char_indices()
        .nth(SEAM_CHARS)
        .map_or(text.len(), |(i, _)| i);
    &text[..end]
}

/// `text` with each line break that has a digit on both sides (spaces
/// and tabs around it included) replaced by `with`; `None` without one.
fn join_broken_numbers(text: &str, with: &str) -> Option<String> {
    static BREAK: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"[ \t]*\r?\n[ \t]*").expect("line breaks"));
    let bytes = text.as_bytes();
    let mut joined = String::new();
    let mut copied = 0;
    for m in BREAK.find_iter(text) {
        let digit_before = m.start() > 0 && bytes[m.start() - 1].is_ascii_digit();
        let digit_after = bytes.get(m.end()).is_some_and(u8::is_ascii_digit);
        if digit_before && digit_after {
            joined.push_str(&text[copied..m.start()]);
            joined.push_str(with);
            copied = m.end();
        }
    }
    if copied == 0 {
        return None;
    }
    joined.push_str(&text[copied..]);
    Some(joined)
}

/// A number as typed, its digits apart or not (a Chinese resident ID may
/// end in X).
static RUN: std::sync::LazyLock<Regex> =
    std::sync::LazyLock::new(|| Regex::new(r"\d(?:[ .\-]?\d)*[Xx]?").expect("digit runs"));

/// Words that name an Aadhaar, whose check passes one number in ten.
static AADHAAR_WORDS: std::sync::LazyLock<Regex> =
    std::sync::LazyLock::new(|| Regex::new(r"(?i)aadhaar|uidai|आधार").expect("aadhaar words"));

/// Words that name a payment card, in the languages of the other rules.
static CARD_WORDS: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:cards?|credit|debit|cc|karten?\w*|carte|tarjeta|cartão|carta|kart|karta|kort|kaart|карта|kártya|κάρτα|thẻ|visa|mastercard|amex)\b|卡|カード|카드|कार्ड|بطاقة")
        .expect("card words")
});

/// Numbers typed in parts across turns, with words between them ("it
/// starts 4111 1111", "and ends 1111 1111"): consecutive runs of digits
/// from more than one text (one text alone was scanned already) that
/// together make a card (13–19 digits, Luhn), an NHS number (10, mod 11),
/// an Aadhaar (12, Verhoeff), a US SSN (9) or a Chinese resident ID (18,
/// its check) — all but the card only when the conversation names them,
/// as their checks pass many numbers.
fn split_numbers(texts: &[String], joined: &str) -> Vec<&'static str> {
    static SSN: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"(?i)\bssn\b|social security").expect("ssn words"));
    static CN_ID: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"身份证|身份號|公民身份|居民身份|(?i)resident id").expect("resident id words")
    });
    static NHS: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"(?i)nhs|patient").expect("nhs words"));
    let runs: Vec<(usize, String)> = texts
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            RUN.find_iter(t).map(move |m| {
                let value = |c: &char| c.is_ascii_digit() || *c == 'X' || *c == 'x';
                (i, m.as_str().chars().filter(value).collect())
            })
        })
        .collect();
    let (nhs_named, aadhaar_named) = (NHS.is_match(joined), AADHAAR_WORDS.is_match(joined));
    let (ssn_named, cn_named) = (SSN.is_match(joined), CN_ID.is_match(joined));
    let mut found = Vec::new();
    for start in 0..runs.len() {
        let mut digits = String::new();
        for (text, run) in &runs[start..] {
            // An X ends a resident ID only: nothing may follow it.
            if digits.ends_with(['X', 'x']) {
                break;
            }
            digits.push_str(run);
            // Beyond 19 digits no longer run can be one: linear overall.
            if digits.len() > 19 {
                break;
            }
            if *text == runs[start].0 {
                continue;
            }
            if digits.ends_with(['X', 'x']) {
                if digits.len() == 18 && cn_named && validate::cn_resident_id(&digits) {
                    found.push("cn-resident-id");
                }
                continue;
            }
            match digits.len() {
                13..=19 if validate::luhn(&digits) => found.push("payment-card"),
                10 if nhs_named && validate::nhs(&digits) => found.push("nhs-number"),
                12 if aadhaar_named && validate::verhoeff(&digits) => found.push("in-aadhaar"),
                9 if ssn_named && validate::ssn(&digits) => found.push("us-ssn"),
                _ => {}
            }
            if digits.len() == 18 && cn_named && validate::cn_resident_id(&digits) {
                found.push("cn-resident-id");
            }
        }
    }
    found
}

/// A phone number typed in two parts with words before the second ("the
/// first half is 03-5641", "go on", "the second is 9529"): a text that
/// ends in a number and the next text with a number, whose first number
/// completes it to 9–11 digits (Spain's, Japan's, China's), in a
/// conversation that names a phone. Without a check to confirm it, only
/// that shape: a number ending one text and opening the next one's.
fn split_phone(texts: &[String]) -> bool {
    static PHONE: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"(?i)phone|\btel\b|mobile|\bcell|telefon|teléfono|móvil|\bfijo\b|portable|cellulare|handy|电话|手机|電話|携帯|전화|휴대폰|핸드폰|телефон|फ़ोन|फोन|هاتف|جوال|whatsapp")
            .expect("phone words")
    });
    let digits = |s: &str| s.chars().filter(char::is_ascii_digit).count();
    fn ending(t: &str) -> Option<regex::Match<'_>> {
        let t = t.trim_end_matches(|c: char| {
            c.is_whitespace() || c.is_ascii_punctuation() || "。．、".contains(c)
        });
        RUN.find_iter(t).last().filter(|m| m.end() == t.len())
    }
    let mut named = None;
    for (i, text) in texts.iter().enumerate() {
        let Some(first) = ending(text) else { continue };
        let Some(next) = texts[i + 1..].iter().find_map(|t| RUN.find(t)) else {
            continue;
        };
        let total = digits(first.as_str()) + digits(next.as_str());
        if (9..=11).contains(&total)
            && *named.get_or_insert_with(|| texts.iter().any(|t| PHONE.is_match(t)))
        {
            return true;
        }
    }
    false
}

/// Does `rule` confirm a value somewhere in `text`? Candidates may
/// overlap: a match takes the character after its value as its end
/// boundary, and that character is also the start boundary of the next
/// value ("passport 125230735").
fn matches(rule: &Rule, text: &str) -> bool {
    // Most rules match nothing in most texts: a plain search says so
    // without the capture slots a search for groups allocates.
    let Some(first) = rule.pattern.find(text) else {
        return false;
    };
    let mut slots = rule.pattern.capture_locations();
    let mut at = first.start();
    for _ in 0..MAX_CANDIDATES {
        if at > text.len() {
            return false;
        }
        let Some(whole) = rule.pattern.captures_read_at(&mut slots, text, at) else {
            return false;
        };
        // The value is group 1 where the rule has one, else the match.
        let value = slots.get(1).unwrap_or((whole.start(), whole.end()));
        if rule
            .check
            .is_none_or(|check| check(&text[value.0..value.1]))
            && rule
                .context
                .as_ref()
                .is_none_or(|words| words.is_match(before(text, value.0)))
            && rule
                .unless
                .as_ref()
                .is_none_or(|words| !words.is_match(before(text, value.0)))
        {
            return true;
        }
        // Not confirmed: try again one character after the value's start,
        // so a value inside a longer false candidate is still seen ("ID
        // DE577834810": the candidate "ID DE5778…" fails, "DE5778…" is
        // next). Patterns are bounded, so this stays linear in practice.
        at = value.0 + text[value.0..].chars().next().map_or(1, char::len_utf8);
    }
    // So many look-alikes that checking them all would cost too much:
    // treated as found, since a miss could let data out.
    true
}

/// Candidates one rule checks in one text before it counts as found.
const MAX_CANDIDATES: usize = 4096;

/// Up to [`CONTEXT_CHARS`] characters before byte `at`.
fn before(text: &str, at: usize) -> &str {
    last_chars(&text[..at], CONTEXT_CHARS)
}

#[cfg(test)]
mod tests;
