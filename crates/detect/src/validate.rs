//! Checksums and format rules that confirm a candidate match, so a pattern
//! that would fire on ordinary numbers only counts when the number really
//! is an identifier of that kind. Every check reads digits and letters and
//! ignores separators (spaces, dots, dashes).

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(|c| c.to_digit(10)).collect()
}

fn alnum_upper(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// A card among the digit groups of a candidate: the greedy pattern may
/// have taken an expiry date or a CVV after the number ("4111 1111 1111
/// 1111 12/25"), so every run of whole groups is tried.
pub fn card(s: &str) -> bool {
    let groups: Vec<&str> = s.split([' ', '.', '-']).filter(|g| !g.is_empty()).collect();
    (0..groups.len()).any(|i| (i + 1..=groups.len()).any(|j| luhn(&groups[i..j].concat())))
}

/// Payment cards (ISO/IEC 7812): 13–19 digits, Luhn, not one repeated digit.
pub fn luhn(s: &str) -> bool {
    let d = digits(s);
    if !(13..=19).contains(&d.len()) || d.iter().all(|&x| x == d[0]) {
        return false;
    }
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| match (i % 2, x * 2) {
            (1, y) if y > 9 => y - 9,
            (1, y) => y,
            _ => x,
        })
        .sum();
    sum.is_multiple_of(10)
}

/// IBAN lengths by country (the ISO 13616 registry), so a match that ran
/// on into the next word ("… 4911 avant") is cut where the IBAN ends.
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VG", 24),
    ("XK", 20),
];

/// IBAN (ISO 13616): the country's length, letters to numbers, the whole
/// mod 97 is 1.
pub fn iban(s: &str) -> bool {
    let s = alnum_upper(s);
    let Some(&(_, len)) = IBAN_LENGTHS.iter().find(|(c, _)| s.starts_with(c)) else {
        return false;
    };
    if s.len() < len {
        return false;
    }
    let s = &s[..len];
    let rearranged = format!("{}{}", &s[4..], &s[..4]);
    let mut rem = 0u64;
    for c in rearranged.chars() {
        let v = match c.to_digit(36) {
            Some(v) => v as u64,
            None => return false,
        };
        rem = if v < 10 {
            (rem * 10 + v) % 97
        } else {
            (rem * 100 + v) % 97
        };
    }
    rem == 1
}

/// US SSN: area not 000, 666 or 9xx; group not 00; serial not 0000.
pub fn ssn(s: &str) -> bool {
    let d = digits(s);
    if d.len() != 9 {
        return false;
    }
    let area = d[0] * 100 + d[1] * 10 + d[2];
    area != 0 && area != 666 && area < 900 && (d[3], d[4]) != (0, 0) && d[5..] != [0, 0, 0, 0]
}

/// UK National Insurance number: the prefix rules of HMRC's format.
pub fn nino(s: &str) -> bool {
    let s = alnum_upper(s);
    let b = s.as_bytes();
    if b.len() != 9 {
        return false;
    }
    let (first, second) = (b[0] as char, b[1] as char);
    !"DFIQUV".contains(first)
        && !"DFIOQUV".contains(second)
        && !["BG", "GB", "NK", "KN", "TN", "NT", "ZZ"].contains(&&s[..2])
        && "ABCD".contains(b[8] as char)
}

/// NHS number: 10 digits, mod-11 check digit (weights 10..2).
pub fn nhs(s: &str) -> bool {
    let d = digits(s);
    if d.len() != 10 || d.iter().all(|&x| x == d[0]) {
        return false;
    }
    let sum: u32 = d[..9].iter().zip((2..=10).rev()).map(|(x, w)| x * w).sum();
    let check = (11 - sum % 11) % 11;
    check != 10 && check == d[9]
}

/// Chinese resident identity number (GB 11643): ISO 7064 MOD 11-2.
pub fn cn_resident_id(s: &str) -> bool {
    let s = alnum_upper(s);
    if s.len() != 18 {
        return false;
    }
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    let mut sum = 0;
    for (c, w) in s.chars().take(17).zip(W) {
        match c.to_digit(10) {
            Some(d) => sum += d * w,
            None => return false,
        }
    }
    let check = b"10X98765432"[(sum % 11) as usize] as char;
    s.ends_with(check)
}

/// Aadhaar: 12 digits, first 2–9, Verhoeff check digit.
pub fn verhoeff(s: &str) -> bool {
    const D: [[u8; 10]; 10] = [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        [1, 2, 3, 4, 0, 6, 7, 8, 9, 5],
        [2, 3, 4, 0, 1, 7, 8, 9, 5, 6],
        [3, 4, 0, 1, 2, 8, 9, 5, 6, 7],
        [4, 0, 1, 2, 3, 9, 5, 6, 7, 8],
        [5, 9, 8, 7, 6, 0, 4, 3, 2, 1],
        [6, 5, 9, 8, 7, 1, 0, 4, 3, 2],
        [7, 6, 5, 9, 8, 2, 1, 0, 4, 3],
        [8, 7, 6, 5, 9, 3, 2, 1, 0, 4],
        [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
    ];
    const P: [[u8; 10]; 8] = [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        [1, 5, 7, 6, 2, 8, 3, 0, 9, 4],
        [5, 8, 0, 3, 7, 9, 6, 1, 4, 2],
        [8, 9, 1, 6, 0, 4, 3, 5, 2, 7],
        [9, 4, 5, 3, 1, 2, 6, 8, 7, 0],
        [4, 2, 8, 6, 5, 7, 3, 9, 0, 1],
        [2, 7, 9, 3, 8, 0, 6, 4, 1, 5],
        [7, 0, 4, 6, 9, 1, 3, 2, 5, 8],
    ];
    let d = digits(s);
    if d.len() != 12 || d[0] < 2 {
        return false;
    }
    let c = d.iter().rev().enumerate().fold(0u8, |c, (i, &x)| {
        D[c as usize][P[i % 8][x as usize] as usize]
    });
    c == 0
}

/// US bank routing number (ABA): weights 3, 7, 1.
pub fn aba(s: &str) -> bool {
    let d = digits(s);
    d.len() == 9
        && d.chunks(3)
            .map(|c| 3 * c[0] + 7 * c[1] + c[2])
            .sum::<u32>()
            .is_multiple_of(10)
}

/// IPv4: four octets up to 255, not all zero.
pub fn ipv4(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 4
        && parts.iter().all(|p| p.parse::<u8>().is_ok())
        && !parts
            .iter()
            .all(|p| ["0", "128", "192", "224", "240", "248", "252", "254", "255"].contains(p))
}

/// An IPv4 address, perhaps with a prefix length: a network written with
/// its prefix and no host bits ("10.0.0.0/16") names no host.
pub fn ip_address(s: &str) -> bool {
    let (address, prefix) = match s.split_once('/') {
        Some((address, prefix)) => (address, prefix.parse::<u32>().ok()),
        None => (s, None),
    };
    if !ipv4(address) {
        return false;
    }
    match prefix {
        Some(bits @ 0..=31) => {
            let value = address
                .split('.')
                .fold(0_u32, |acc, p| (acc << 8) | p.parse::<u32>().unwrap_or(0));
            value & (u32::MAX >> bits) != 0
        }
        // "/32" is one host; "/40" is no prefix length: the address alone
        // counts.
        _ => true,
    }
}

/// EU VAT numbers by country format, separators ignored.
pub fn eu_vat(s: &str) -> bool {
    static FORMATS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(?:ATU\d{8}|BE[01]\d{9}|DE\d{9}|DK\d{8}|FR[0-9A-Z]{2}\d{9}|IT\d{11}|ES[0-9A-Z]\d{7}[0-9A-Z]|NL\d{9}B\d{2}|PL\d{10}|SE\d{12}|IE\d{7}[A-Z]{1,2}|PT\d{9}|FI\d{8}|GB\d{9}|LU\d{8}|CZ\d{8,10}|EL\d{9}|HU\d{8}|RO\d{2,10}|SK\d{10}|SI\d{8}|HR\d{11}|BG\d{9,10}|LT\d{9,12}|LV\d{11}|EE\d{9}|MT\d{8}|CY\d{8}[A-Z])$")
            .expect("VAT formats")
    });
    FORMATS.is_match(&alnum_upper(s))
}

/// A VAT or tax number written without its country's prefix, as the
/// country's own invoices print it, that passes that country's check:
/// Italy's partita IVA (11 digits, Luhn), Croatia's OIB (11, ISO 7064
/// MOD 11,10), Poland's NIP (10, weighted mod 11), Portugal's NIF/NIPC
/// and Germany's USt-IdNr. (9: weighted mod 11; MOD 11,10), Spain's CIF
/// (a letter, 7 digits, a control) and NIF or NIE (8 digits, or X, Y or Z
/// and 7, and the DNI letter). Only right after a tax word (see the
/// rule): for 9 and 11 digits two checks are tried, so one number in five
/// or six passes by chance.
pub fn national_vat(s: &str) -> bool {
    let v = alnum_upper(s);
    let d = digits(&v);
    let all_digits = d.len() == v.len();
    let mod11_10 = |d: &[u32]| {
        let mut p = 10;
        for &x in &d[..d.len() - 1] {
            let sum = (x + p) % 10;
            p = (if sum == 0 { 10 } else { sum } * 2) % 11;
        }
        (11 - p) % 10 == d[d.len() - 1]
    };
    match (all_digits, d.len()) {
        (true, 11) => {
            // Luhn over 11 digits (`luhn` is a card's, 13 to 19).
            let sum: u32 = d
                .iter()
                .rev()
                .enumerate()
                .map(|(i, &x)| {
                    if !i.is_multiple_of(2) {
                        (x * 2) % 9 + u32::from(x == 9) * 9
                    } else {
                        x
                    }
                })
                .sum();
            (sum.is_multiple_of(10) && d.iter().any(|&x| x != d[0])) || mod11_10(&d)
        }
        (true, 10) => {
            let sum: u32 = [6, 5, 7, 2, 3, 4, 5, 6, 7]
                .iter()
                .zip(&d)
                .map(|(w, x)| w * x)
                .sum();
            sum % 11 == d[9]
        }
        (true, 9) => {
            let sum: u32 = (2..=9).rev().zip(&d).map(|(w, x)| w * x).sum();
            let pt = match 11 - sum % 11 {
                10 | 11 => 0,
                c => c,
            };
            (d[0] != 0 && pt == d[8]) || mod11_10(&d)
        }
        _ => spanish_tax_id(&v),
    }
}

/// Spain's CIF (a company: a letter, 7 digits, a digit or letter of
/// control) and NIF of a person (the DNI's 8 digits and its letter).
fn spanish_tax_id(v: &str) -> bool {
    let b = v.as_bytes();
    if b.len() != 9 {
        return false;
    }
    // A foreigner's NIE: X, Y, Z for 0, 1, 2 before the DNI's digits.
    let first = match b[0] {
        b'X' => Some(b'0'),
        b'Y' => Some(b'1'),
        b'Z' => Some(b'2'),
        c if c.is_ascii_digit() => Some(c),
        _ => None,
    };
    if let Some(first) = first
        && b[1..8].iter().all(u8::is_ascii_digit)
        && b[8].is_ascii_alphabetic()
    {
        let n: usize = std::str::from_utf8(&[&[first][..], &b[1..8]].concat())
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        return b[8] == b"TRWAGMYFPDXBNJZSQVHLCKE"[n % 23];
    }
    if !b"ABCDEFGHJNPQRSUVW".contains(&b[0]) || !b[1..8].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut sum = 0;
    for (i, c) in b[1..8].iter().enumerate() {
        let x = u32::from(c - b'0');
        sum += if i.is_multiple_of(2) {
            let y = x * 2;
            y / 10 + y % 10
        } else {
            x
        };
    }
    let control = (10 - sum % 10) % 10;
    b[8] == b'0' + control as u8 || b[8] == b"JABCDEFGHI"[control as usize]
}

/// A passport number: 6 to 9 letters and digits with at least two digits
/// (so the word after "passport" is not taken for one).
pub fn passport_shape(s: &str) -> bool {
    (6..=9).contains(&s.len()) && s.chars().filter(char::is_ascii_digit).count() >= 2
}

/// The second line of a passport's machine-readable zone (ICAO 9303,
/// TD3): the document number's and the date of birth's check digits
/// (weights 7, 3, 1; `<` counts 0, letters 10–35) both hold. A random
/// 44-character line passes one time in a hundred.
pub fn mrz_line(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 28 {
        return false;
    }
    let value = |c: u8| match c {
        b'0'..=b'9' => Some(u32::from(c - b'0')),
        b'A'..=b'Z' => Some(u32::from(c - b'A') + 10),
        b'<' => Some(0),
        _ => None,
    };
    let check = |field: &[u8], digit: u8| {
        let sum: Option<u32> = field
            .iter()
            .zip([7, 3, 1].iter().cycle())
            .map(|(&c, w)| value(c).map(|v| v * w))
            .sum();
        sum.is_some_and(|sum| digit.is_ascii_digit() && sum % 10 == u32::from(digit - b'0'))
    };
    check(&b[0..9], b[9]) && check(&b[13..19], b[19])
}

/// An international phone number has 8 to 15 digits (E.164).
pub fn phone_digits(s: &str) -> bool {
    (8..=15).contains(&digits(s).len())
}

/// A value that looks random (a secret), not a word or a placeholder:
/// enough length, several character classes, and Shannon entropy of at
/// least 3.5 bits a character.
pub fn high_entropy(s: &str) -> bool {
    let s = s.trim_matches(|c| c == '"' || c == '\'');
    if s.len() < 16 {
        return false;
    }
    let classes = [
        s.chars().any(|c| c.is_ascii_lowercase()),
        s.chars().any(|c| c.is_ascii_uppercase()),
        s.chars().any(|c| c.is_ascii_digit()),
    ]
    .iter()
    .filter(|&&b| b)
    .count();
    let mut counts = std::collections::HashMap::new();
    for c in s.chars() {
        *counts.entry(c).or_insert(0u32) += 1;
    }
    let n = s.chars().count() as f64;
    let entropy: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    classes >= 2 && entropy >= 3.5
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_accept_valid_and_refuse_altered_values() {
        assert!(luhn("4111 1111 1111 1111") && !luhn("4111 1111 1111 1112"));
        assert!(iban("DE89 3704 0044 0532 0130 00") && !iban("DE88 3704 0044 0532 0130 00"));
        assert!(iban("gb82west12345698765432"));
        assert!(ssn("123-45-6789") && !ssn("666-45-6789") && !ssn("123-00-6789"));
        assert!(nino("AB 12 34 56 C") && !nino("QQ123456C") && !nino("GB123456A"));
        assert!(nhs("943 476 5919") && !nhs("943 476 5918"));
        assert!(cn_resident_id("11010519491231002X") && !cn_resident_id("110105194912310021"));
        assert!(
            verhoeff("2345 6789 0124") || verhoeff("2345 6789 0120") || verhoeff("2345 6789 0127")
        );
        assert!(!verhoeff("1234 5678 9012"));
        assert!(aba("021000021") && !aba("021000022"));
        assert!(ipv4("192.168.1.20") && !ipv4("300.1.1.1") && !ipv4("0.0.0.0"));
        assert!(high_entropy("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"));
        assert!(!high_entropy("my_password_here") && !high_entropy("aaaaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn some_valid_aadhaar_exists_among_check_digits() {
        // Exactly one check digit completes a Verhoeff number.
        let valid = (0..10)
            .filter(|d| verhoeff(&format!("2345 6789 012{d}")))
            .count();
        assert_eq!(valid, 1);
    }
}
