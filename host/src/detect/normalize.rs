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
    )
}

pub fn normalize(text: &str) -> String {
    text.nfkc().filter(|c| !invisible(*c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_width_and_invisible_characters_fold_away() {
        assert_eq!(normalize("４１１１\u{200B}１１１１"), "41111111");
        assert_eq!(normalize("DE89\u{00AD}3704"), "DE893704");
        assert_eq!(normalize("plain text"), "plain text");
    }
}
