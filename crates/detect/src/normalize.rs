//! Text as detectors read it: an identifier written a little differently
//! (full-width digits, a zero-width space inside it, a soft hyphen) must
//! still be found. Unicode compatibility forms are folded (NFKC: "４"
//! becomes "4", "ﬁ" "fi"), and invisible characters are dropped. Case is
//! kept: rules that ignore it say so, and some formats (element symbols,
//! IBAN country codes) are written in one case.

use unicode_normalization::UnicodeNormalization;

/// Characters that render as nothing but split a token for a regex.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'              // soft hyphen
            | '\u{034F}'        // combining grapheme joiner
            | '\u{180E}'        // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}' // zero-width space/joiners, LRM/RLM
            | '\u{202A}'..='\u{202E}' // bidi embeddings
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{FEFF}'        // zero-width no-break space
            | '\u{061C}'        // Arabic letter mark
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{E0000}'..='\u{E007F}' // tag characters
    )
}

/// The zero of each decimal digit script a number may be typed in besides
/// ASCII (full-width digits are folded by NFKC already).
const DIGIT_ZEROS: [u32; 12] = [
    0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6, 0x0E50,
];

/// Digits of other scripts as ASCII digits; dashes and minus signs as '-'.
fn fold(c: char) -> char {
    let u = c as u32;
    if let Some(zero) = DIGIT_ZEROS.iter().find(|&&z| (z..z + 10).contains(&u)) {
        return char::from(b'0' + (u - zero) as u8);
    }
    match c {
        '\u{2010}'..='\u{2015}' | '\u{2212}' | '\u{FE63}' => '-',
        _ => c,
    }
}

pub fn normalize(text: &str) -> String {
    let text: String = text.nfkc().filter(|c| !invisible(*c)).map(fold).collect();
    if text.contains('\n') && text.contains('-') {
        rejoin(&text)
    } else {
        text
    }
}

/// A word or number a PDF's or a scan's copy broke at a line's end with a
/// hyphen ("Gneisenau-\nstraße 41", "Ber-\nlin", "772-40-\n5617"): a
/// word goes back together, a number keeps its dash; anything else (a
/// number then a word, hex) is left as it is.
fn rejoin(text: &str) -> String {
    static BROKEN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(\p{L}-|\d-)[ \t]*\r?\n[ \t]*(\p{Ll}|\d)").expect("broken words")
    });
    if !BROKEN.is_match(text) {
        return text.to_string();
    }
    BROKEN
        .replace_all(text, |c: &regex::Captures| {
            let (before, after) = (&c[1][..c[1].len() - 1], &c[2]);
            let digit = |s: &str| s.starts_with(|c: char| c.is_ascii_digit());
            let letter = |s: &str| s.starts_with(char::is_alphabetic);
            if digit(before) && digit(after) {
                format!("{before}-{after}")
            } else if letter(before) && letter(after) {
                format!("{before}{after}")
            } else {
                c[0].to_string()
            }
        })
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_width_and_invisible_characters_fold_away() {
        assert_eq!(normalize("４１１１\u{200B}１１１１"), "41111111");
        assert_eq!(normalize("DE89\u{00AD}3704"), "DE893704");
        assert_eq!(normalize("plain text"), "plain text");
        assert_eq!(normalize("٤١١١\u{2066}१२"), "411112");
        assert_eq!(normalize("12\u{2011}34\u{2212}5"), "12-34-5");
    }

    #[test]
    fn words_and_numbers_broken_at_a_line_end_are_rejoined() {
        assert_eq!(
            normalize("Gneisenau-\nstraße 41, Ber-\nlin"),
            "Gneisenaustraße 41, Berlin"
        );
        assert_eq!(normalize("SSN 772-40-\n5617"), "SSN 772-40-5617");
        // A list's dash and a capital after the break are left alone.
        assert_eq!(normalize("- one\n- two"), "- one\n- two");
        assert_eq!(normalize("North-\nEast"), "North-\nEast");
        assert_eq!(normalize("SSN 772-40-\r\n5617"), "SSN 772-40-5617");
        // A number then a word, and hex, keep their hyphen and break.
        assert_eq!(normalize("1111-\nbitte"), "1111-\nbitte");
    }
}
