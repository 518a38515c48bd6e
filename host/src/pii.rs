//! A conservative personal-data detector. It errs towards "sensitive":
//! a false positive keeps a request local, a false negative could leak it.

use regex::Regex;
use std::sync::LazyLock;

struct Detector {
    kind: &'static str,
    pattern: Regex,
    /// Extra check on a match (checksums), to keep false positives rare
    /// where a plain pattern would fire on ordinary numbers.
    confirm: fn(&str) -> bool,
}

static DETECTORS: LazyLock<Vec<Detector>> = LazyLock::new(|| {
    let always = |_: &str| true;
    vec![
        Detector {
            kind: "email",
            pattern: Regex::new(r"(?i)\b[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}\b").unwrap(),
            confirm: always,
        },
        Detector {
            kind: "us-ssn",
            pattern: Regex::new(r"\b\d{3}-\d{2}-\d{4}\b").unwrap(),
            confirm: always,
        },
        Detector {
            kind: "payment-card",
            pattern: Regex::new(r"\b(?:\d[ -]?){12,18}\d\b").unwrap(),
            confirm: luhn_valid,
        },
        Detector {
            kind: "iban",
            pattern: Regex::new(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b")
                .unwrap(),
            confirm: always,
        },
        Detector {
            kind: "phone",
            pattern: Regex::new(r"(?:\+\d{1,3}[ .-]?)?\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}\b").unwrap(),
            confirm: always,
        },
    ]
});

/// The kinds of personal data found in `text`, in a fixed order.
pub fn detect(text: &str) -> Vec<&'static str> {
    DETECTORS
        .iter()
        .filter(|d| d.pattern.find_iter(text).any(|m| (d.confirm)(m.as_str())))
        .map(|d| d.kind)
        .collect()
}

fn luhn_valid(candidate: &str) -> bool {
    let digits: Vec<u32> = candidate.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let doubled = d * 2;
                if doubled > 9 { doubled - 9 } else { doubled }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::detect;

    #[test]
    fn finds_common_personal_data() {
        assert_eq!(detect("write to jane.doe@example.com"), vec!["email"]);
        assert_eq!(detect("SSN 123-45-6789 on file"), vec!["us-ssn"]);
        assert_eq!(detect("card 4111 1111 1111 1111"), vec!["payment-card"]);
        assert_eq!(detect("IBAN DE89 3704 0044 0532 0130 00"), vec!["iban"]);
        assert_eq!(detect("call (555) 123-4567"), vec!["phone"]);
    }

    #[test]
    fn ordinary_text_and_numbers_are_not_flagged() {
        assert!(detect("Summarise the 2024 report in 3 bullet points.").is_empty());
        // 16 digits that fail the Luhn check are an order number, not a card.
        assert!(detect("order 1234 5678 9012 3456").is_empty());
    }
}
