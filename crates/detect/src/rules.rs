//! The rules, as data: a kind, a pattern, an optional check that confirms
//! a match (a checksum or a format rule), and optional context words that
//! must appear shortly before it (a passport number is any 6–9 letters
//! and digits; after "passport" it is one).
//!
//! No maintained rule set fits: gitleaks' and detect-secrets' rules live
//! in Go and Python code rather than in a package this build can read, and
//! the Rust PII crates cover one region or none of the checksums. So the
//! formats are written here from their public specifications (ISO 13616,
//! ISO/IEC 7812, HMRC, GB 11643, UIDAI, the providers' documented key
//! prefixes), each with a test.
//!
//! Digits may be separated by spaces, dots or dashes; boundaries are ASCII
//! (a Chinese character next to a number is not a word character here,
//! unlike in Unicode `\b`), so "身份证号11010519491231002X" is found.

use super::validate as v;
use regex::Regex;

#[derive(Clone)]
pub struct Rule {
    pub kind: &'static str,
    /// Group 1, when present, is the value the check reads.
    pub pattern: Regex,
    pub check: Option<fn(&str) -> bool>,
    /// Must match within [`CONTEXT_CHARS`] before the value.
    pub context: Option<Regex>,
    /// Must not match there: words that make the value something else.
    pub unless: Option<Regex>,
    /// The fewest ASCII digits a match holds: a text with fewer is not
    /// searched (see `must_hold`).
    pub min_digits: usize,
    /// The context words must appear somewhere in a text for the rule to
    /// match it (they hold no assertion): a text without them is not
    /// searched.
    pub context_anywhere: bool,
}

impl Rule {
    pub fn new(kind: &'static str, pattern: Regex, check: Option<fn(&str) -> bool>) -> Self {
        Self {
            kind,
            min_digits: crate::must_hold::min_digits(pattern.as_str()),
            pattern,
            check,
            context: None,
            unless: None,
            context_anywhere: false,
        }
    }
}

/// How far before a value its context words may be.
pub const CONTEXT_CHARS: usize = 48;

/// The words before a VAT number, in the languages of its formats.
const VAT_WORDS: &str =
    r"vat|ust|mwst|tva|iva|btw|moms|nif|nip|uid|tax|steuer|dič|alv|oib|增值税|税号";

/// A passport's machine-readable zone, its second line (ICAO 9303, TD3):
/// document number and check digit, nationality, date of birth and check
/// digit, sex, expiry and check digit.
const MRZ_LINE: &str = r"\b[A-Z0-9<]{9}\d[A-Z<]{3}\d{7}[MFX<]\d{7}";

/// Start and end of a value: not inside a longer run of ASCII letters or
/// digits.
const B: &str = r"(?:^|[^0-9A-Za-z])";
const E: &str = r"(?:[^0-9A-Za-z]|$)";
/// A separator allowed between the digits of a number.
const S: &str = r"[ .\-]?";

fn bounded(inner: &str) -> String {
    format!("{B}({inner}){E}")
}

fn rule(kind: &'static str, pattern: &str, check: Option<fn(&str) -> bool>) -> Rule {
    let pattern = Regex::new(&ascii(pattern)).unwrap_or_else(|e| panic!("rule {kind}: {e}"));
    Rule::new(kind, pattern, check)
}

/// A pattern with ASCII word boundaries and ASCII digits: Unicode `\b`
/// finds no boundary between "是" and a Latin letter (CJK characters are
/// word characters), so "邮箱是jane@example.com" would be missed, and
/// Unicode `\d` matches digits of other scripts, which `normalize` has
/// already turned into ASCII ones.
fn ascii(pattern: &str) -> String {
    pattern.replace(r"\b", r"(?-u:\b)").replace(r"\d", "[0-9]")
}

fn with_context(mut r: Rule, words: &str) -> Rule {
    let context = Regex::new(&format!("(?i)(?:{words})")).expect("context words");
    r.context_anywhere = crate::must_hold::assertion_free(context.as_str());
    r.context = Some(context);
    r
}

fn unless(mut r: Rule, words: &str) -> Rule {
    r.unless = Some(Regex::new(&ascii(&format!("(?i)(?:{words})"))).expect("unless words"));
    r
}

/// Every built-in rule.
pub fn builtin() -> Vec<Rule> {
    let digits = |n: usize| format!(r"\d(?:{S}\d){{{}}}", n - 1);
    let rules = vec![
        // Structured identifiers.
        rule(
            "email",
            // Letters of any script before and after the '@'
            // (jürgen.weiß@…, contact@café.example.org); `+`, not a
            // counted repeat, for the automaton's size (see below).
            // No boundary before it: "иван@mail.ru" starts with letters
            // an ASCII boundary does not see.
            r"(?i)[\p{L}\p{N}._%+-]+@[\p{L}\p{N}.-]+\.[a-z]{2,24}\b",
            None,
        ),
        rule(
            "payment-card",
            &bounded(&format!(r"\d(?:{S}\d){{12,18}}")),
            Some(v::card),
        ),
        rule(
            "iban",
            // A line break too: an IBAN broken over two lines of a PDF.
            &bounded(r"[A-Za-z]{2}\d{2}(?:(?:[ .\-]|\n)?[A-Za-z0-9]){11,30}"),
            Some(v::iban),
        ),
        rule(
            "us-ssn",
            &bounded(r"\d{3}[ .\-]\d{2}[ .\-]\d{4}"),
            Some(v::ssn),
        ),
        with_context(
            rule("us-ssn", &bounded(r"\d{9}"), Some(v::ssn)),
            r"ssn|social security",
        ),
        rule(
            "uk-nino",
            &bounded(r"[A-Za-z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-Da-d]"),
            Some(v::nino),
        ),
        with_context(
            rule("nhs-number", &bounded(&digits(10)), Some(v::nhs)),
            r"nhs|patient|health (?:service )?(?:number|no)|hospital",
        ),
        rule(
            "cn-resident-id",
            &bounded(
                r"\d{6} ?(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]) ?\d{3}[\dXx]",
            ),
            Some(v::cn_resident_id),
        ),
        // As OCR spaces it, in fours: 4201 0619 6308 0361 30.
        rule(
            "cn-resident-id",
            &bounded(r"\d{4}(?: \d{4}){3} \d[\dXx]"),
            Some(v::cn_resident_id),
        ),
        rule(
            "in-aadhaar",
            &bounded(r"[2-9]\d{3}[ \-]?\d{4}[ \-]?\d{4}"),
            Some(v::verhoeff),
        ),
        with_context(
            rule(
                "eu-vat",
                &bounded(r"[A-Z]{2} ?[0-9A-Z](?:[ .\-]?[0-9A-Z]){7,12}"),
                Some(v::eu_vat),
            ),
            VAT_WORDS,
        ),
        // In lower case ("vat no: fr13371104993"): a separator only before
        // a digit, so the next word is not taken into it.
        with_context(
            rule(
                "eu-vat",
                &bounded(r"[a-z]{2} ?[0-9a-z](?:[ .\-]?[0-9]|[a-z]){7,12}"),
                Some(v::eu_vat),
            ),
            VAT_WORDS,
        ),
        // Without the prefix, as a country's own invoices print it ("P.IVA
        // 10562300375", "NIP: 618-083-36-43", "NIPC: 543862410", "CIF:
        // B46143798", "NIE X2482300W"): that country's check, right after
        // a tax word of a country whose numbers have one. The checks pass
        // one number in five to eleven, so the word must be the label
        // (not "VAT invoice 123456789", "btw, order 123456789"), and no
        // dot may join the digits (amounts: "VAT 10.00 120.00").
        rule(
            "eu-vat",
            r#"(?i)(?:^|[^\p{L}])(?:vat(?:\s?(?:no|nr|number|id|reg(?:istration)?(?:\s?no)?))?|nif|nie|nipc|nip|cif|p\.\s?iva|partita[\s_]iva|c\.\s?f\.|codice fiscale|oib|ust-?id(?:nr)?|ust\.-?idnr)\.?["']?\s{0,3}[:#=]?\s{0,3}["']?([A-Za-z]?[ \-]?\d(?:[ \-]?\d){6,10}(?:[ \-]?[A-Za-z])?)(?:[^0-9A-Za-z]|$)"#,
            Some(v::national_vat),
        ),
        with_context(
            rule(
                "passport",
                &bounded(r"[A-Za-z0-9]{6,9}"),
                Some(v::passport_shape),
            ),
            r"passport|reisepass|passeport|pasaporte|passaport|paspoort|pasaport|paszport|paspor|паспорт|पासपोर्ट|hộ chiếu|جواز السفر|护照|パスポート|旅券|여권",
        ),
        with_context(
            rule(
                "bank-account",
                // Solid (up to 18: Mexico's CLABE, India's longest), or in
                // groups as banks print them (Korea's 110-123-456789, a
                // Chinese 8886 2698 3351, Brazil's 86810-6 with its check
                // digit, Poland's 02 2444 … in 4s, Czechia's 6472346349/5500
                // with the bank's code).
                // Not after a dash either: the tail of a date ("…-10-2023")
                // is not one.
                &format!(
                    r"(?:^|[^0-9A-Za-z\-])(\d{{2}}-\d{{2}}-\d{{2}}|\d{{2,6}}(?:-\d{{1,8}}){{1,3}}|\d{{3,6}}(?: \d{{3,6}}){{1,4}}|\d{{2}}(?: \d{{4}}){{6}}|(?:\d{{1,6}}-)?\d{{6,10}}/\d{{4}}|\d{{6,26}}){E}"
                ),
                Some(not_a_date),
            ),
            r"sort[ _\-]?code|account[ _\-]?(?:number|no|#)|acct|a/c|acc\.? no|bank[ _\-]?account|routing|bsb|clabe|transit number|kontonummer|kontonr|konto|rekeningnummer|no\.?\s?rekening|nomor rekening|bankgiro|plusgiro|numéro de compte|número de cuenta|numero di conto|conto corrente|número da conta|conta corrente|hesap numarası|account\s?:|खाता|rachun|numer konta|číslo účtu|účtu|účet|счёт|счет|رقم الحساب|الحساب البنكي|口座番号|口座|계좌번호|계좌|账号|账户",
        ),
        // An Indian account number beside its branch's IFSC (the code
        // alone names a branch, not an account).
        rule(
            "bank-account",
            r"(?i)\bifsc\b[^\n]{0,80}?\b\d{9,18}\b|\b\d{9,18}\b[^\n]{0,80}?\bifsc\b",
            None,
        ),
        with_context(
            rule("bank-account", &bounded(r"\d{9}"), Some(v::aba)),
            r"routing|aba|rtn",
        ),
        // Phones: international (+ and 8–15 digits), Chinese mobiles,
        // North American, and national formats after a phone word.
        rule(
            "phone",
            // The trunk zero in brackets too: +33 (0)1 99 00 54 22.
            r"\+\d{1,3}[ .\-]?(?:\(0\)[ .\-]?)?\(?\d{1,4}\)?(?:[ .\-]?\d{2,4}){2,4}\b",
            Some(v::phone_digits),
        ),
        rule("phone", &bounded(r"1[3-9]\d{9}"), None),
        // North American 3-3-4, unless a reference's name and number come
        // right before it ("reference 999 244 9791", "order #555-201-0042";
        // not "about the order 917-555-0148", "just in case: …").
        unless(
            rule(
                "phone",
                r"(?:\(\d{3}\)\s?|\b\d{3}[ .\-])\d{3}[ .\-]\d{4}\b",
                None,
            ),
            r"\b(?:(?:reference|ref|order|invoice|ticket|tracking|confirmation|serial)\.?\s{0,2}(?:no\.?|number|nr\.?|#)\s{0,2}:?|reference|ref\.)\s{0,2}$",
        ),
        // National mobile numbers as people write them, distinctive
        // enough without a phone word: French (06 12 34 56 78, pairs
        // apart), British (07700 900123 or 900 123, the space after the prefix),
        // Japanese (090-1234-5678), Spanish (612 48 93 07), German (0151
        // 2345 6789), Dutch (06-12345678), Brazilian ((11) 91234-5678),
        // Chinese spaced 3-4-4 (138 0013 8000), Indian 5-5 (98765 43210),
        // Korean (010-1234-5678), Turkish (0532 123 45 67, 0 (532) 123 45
        // 67), Australian (0491 570 156), Egyptian (0100 189 2608); French
        // landlines in pairs as well as mobiles (01.99.00.95.73).
        // Written solid they are order numbers as often as phones, so the
        // separators are required. One pattern: one search of the text.
        rule(
            "phone",
            &bounded(
                r"0[1-9](?:[ .\-]\d{2}){4}|07\d{3} \d{3} ?\d{3}|0[789]0-\d{4}-\d{4}|[67]\d{2} \d{2} \d{2} \d{2}|01[5-7]\d{1,2} \d{3,4} \d{3,4}|06-\d{8}|\(\d{2}\) ?9?\d{4}-\d{4}|1[3-9]\d[ \-]\d{4}[ \-]\d{4}|[6-9]\d{4} \d{5}|01[016-9]-\d{3,4}-\d{4}|0 ?\(?5\d{2}\)? ?\d{3} \d{2} \d{2}|04\d{2} \d{3} \d{3}|04\d{2}(?: \d{2}){3}|8 ?\(9\d{2}\) ?\d{3}-\d{2}-\d{2}|01[0125]\d[ \-]\d{3}[ \-]\d{4}",
            ),
            None,
        ),
        with_context(
            rule(
                "phone",
                // Middle dots too, as Japanese cards print them (03・7447・0155).
                &bounded(r"\(?\d{2,5}\)?[ .\-/・·]?\d{2,4}[ .\-・·]?\d{2,4}(?:[ .\-・·]?\d{2,4})?"),
                Some(phone_not_date),
            ),
            r"phone|(?:^|[^a-z])tel(?:[eé]?f|no|nr)?(?:[^a-zé]|$)|tél|call|mobile|\bmobil\b|\bcell|\bring(?:e|a|er|es)?\b|whatsapp|signal|fax|telefon|téléphone|teléfono|handy|portable|móvil|telem[oó]vel|celular|cellulare|ll[aá]m|\bbel(?:len)?\b|\bruf\b|rufnummer|anruf|erreichen|aray[ıi]n|\bchama\b|\bzap\b|\bligue?\b|\bhubungi\b|(?-i:\bWA\b)|sđt|điện thoại|\bgọi\b|звонит|звоните|позвон|\n[ \t]*(?:t|m|p|ph|mob)[ \t]?:[ \t]*$|电话|手机|联系|热线|座机|電話|携帯|전화|휴대폰|핸드폰|телефон|мобильн|फ़ोन|फोन|அழை|مو?بايل|هاتف|واتس|اتصل",
        ),
        // Addresses: a house number and a capitalised street name ("221B
        // Baker Street"; "the square" in a sentence is not one), a UK postcode, a
        // US state and ZIP, a German or French street, a Chinese one.
        rule(
            "postal-address",
            r"\b\d{1,5}[A-Za-z]?,?\s{1,3}(?:[A-Z][A-Za-z'.\-]{0,31}\s{1,3}){0,4}(?:Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Boulevard|Blvd|Drive|Dr|Court|Ct|Way|Place|Pl|Terrace|Close|Crescent|Highway|Hwy|Square|Sq|STREET|AVENUE|ROAD)\b\.?",
            None,
        ),
        rule(
            "postal-address",
            r"\b[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2}\b",
            Some(uk_postcode_shape),
        ),
        rule(
            "postal-address",
            r"\b[A-Z]{2},? \d{5}(?:-\d{4})?\b",
            Some(us_state),
        ),
        rule(
            "postal-address",
            r"(?i)\b[a-zäöüßåøæ\-]{1,40}(?:straße|strasse|str\.|weg|platz|allee|gasse|ring|damm|straat|gracht|laan|plein|kade|singel|gatan|vägen|gata|vej|gade|veien)\s{1,3}\d{1,5}[a-z]?\b",
            None,
        ),
        rule(
            "postal-address",
            r"(?i)\b\d{1,4}(?: ?(?:bis|ter))?,?\s{1,3}(?:rue|avenue|av\.|boulevard|bd|place|chemin|allée|impasse|quai|calle|avenida|via|piazza)\s+\w",
            None,
        ),
        rule(
            "postal-address",
            // A Shanghai lane (弄) may come between road and number.
            r"\p{Han}{2,24}(?:路|街|道|巷|里)\s?\d{1,5}\s?(?:弄\s?\d{1,5}\s?)?号",
            None,
        ),
        // A post-office box, in the languages of the other rules, and
        // house, flat and plot numbers as Indian addresses give them
        // ("H. No. 12", "मकान नं. 214"); one pattern.
        rule(
            "postal-address",
            r"(?i)(?:\b(?:p\.? ?o\.? ?box|postbus|postfach|apartado(?: de correos)?|caixa postal|casella postale|boîte postale)\s?\d{1,6}\b|(?:\b(?:house|flat|plot)\s?no\b|\bh\.\s?no\b|(?:मकान|फ्लैट)\s?(?:नं|नंबर))\.?\s?[:#]?\s?\d{1,5})",
            None,
        ),
        // An Irish Eircode, after a county or the country.
        with_context(
            rule(
                "postal-address",
                r"\b(?:[AC-FHKNPRTV-Y]\d{2}|D6W)\s?[0-9AC-FHKNPRTV-Y]{4}\b",
                None,
            ),
            r"\bco\.?\s|county|ireland|éire|eircode|dublin|cork|galway|limerick|waterford",
        ),
        // A line that ends in a house number, then one that starts with
        // a four- or five-digit postcode and a capitalised town: "Am
        // Mühlbach 3a\n83022 Rosenheim", "Meir 52 bus 3\n2000 Antwerpen"
        // (German, French, Spanish, Italian, Turkish, Finnish; Belgian,
        // Swiss, Austrian, Danish postcodes). On one line, "sold 7, 10000
        // Units" is not.
        rule(
            "postal-address",
            r"\b\d{1,3}[a-zA-Z]?[ \t]*\n[ \t]*(?:[A-Z]-)?\d{4,5}[ \t]\p{Lu}\p{Ll}+(?:[ \t\-]\p{Lu}\p{Ll}+)?[ \t]*(?:\n|$)",
            None,
        ),
        // A German street named in two words ("Rosenheimer Str. 118",
        // "Berliner Straße 12"); a vCard's address field with a number;
        // an Australian state and postcode ("Sydney NSW 2000"; not ACT,
        // a law's name, nor SA, WA, NT, words).
        rule(
            "postal-address",
            r"\b\p{Lu}\p{Ll}{2,30}\s(?:Straße|Strasse|Str\.)\s{0,3}\d{1,5}[a-z]?\b",
            None,
        ),
        rule("postal-address", r"(?im)^ADR[;:][^\n]*\d", None),
        rule("postal-address", r"\b(?:NSW|VIC|QLD|TAS)\s\d{4}\b", None),
        // A street as people type it, in lower case ("4821 n lincoln ave
        // apt 2b chicago il 60625", "unit 5/17 smith st fitzroy victoria
        // 3065"): a number, words and a street's type, then on the same line
        // a US or Australian state and its postcode.
        rule(
            "postal-address",
            r"(?i)\b\d{1,5}[a-z]?(?:/\d{1,5}[a-z]?)?\s{1,3}(?:[nsew]\.?\s{1,3})?(?:[a-z][a-z'\-]{1,30}\s{1,3}){1,3}(?:st|street|ave|avenue|rd|road|blvd|boulevard|dr|drive|ln|lane|ct|court|pl|place|pde|parade|cres|crescent|hwy|highway|tce|terrace)\b\.?[^\n]{0,60}?\b(?:(?:AL|AK|AZ|AR|CA|CO|CT|DE|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC|ND|OH|OK|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|DC),?\s{1,3}\d{5}(?:-\d{4})?|(?:NSW|VIC|QLD|SA|TAS|ACT|NT|victoria|queensland|tasmania|new south wales),?\s{1,3}\d{4})\b",
            None,
        ),
        // A Polish street (ul. Marszałkowska 115 m. 24), a Turkish one
        // (Atatürk Cad. No:58), an Arab street, road or district before a
        // five-digit postcode, an Indian flat, plot or sector before a PIN.
        rule(
            "postal-address",
            r"\bul\.\s{0,2}\p{Lu}[\p{L}\-]+(?:\s\p{Lu}[\p{L}\-]+)*\s\d{1,4}[a-z]?\b",
            None,
        ),
        // A Spanish street as "C/ Ferraz 27, …, 28008"; a Czech or Slovak house
        // number with its slash and a postcode in 3 + 2 ("Vinohradská
        // 1511/230, 100 00 Praha").
        rule(
            "postal-address",
            // With a postcode after it: "C/Python 3" is a language.
            r"\bC/\s?(?:de(?:l|\sla)?\s)?\p{Lu}[\p{L}\-]+(?:\s[\p{L}\-]+){0,3},?\s\d{1,4}[,\s][^\n]{0,30}?\b\d{5}\b",
            None,
        ),
        rule(
            "postal-address",
            r"\b\d{1,5}/\d{1,4}[a-z]?,\s{1,2}\d{3}\s?\d{2}\s\p{Lu}\p{Ll}+",
            None,
        ),
        // A Russian street and house ("ул. Тверская, д. 18", "ул.
        // Большая Почтовая, д. 22").
        rule(
            "postal-address",
            r"(?:ул\.|улица|пр-т|проспект|пер\.|переулок)\s{0,2}\p{Lu}[\p{L}\-]+(?:\s[\p{L}\-]+){0,2},?\s{1,2}(?:д\.|дом)\s{0,2}\d{1,4}",
            None,
        ),
        // A street's word, a name and a number, then on the same line a
        // five-digit postcode and a town, as invoices' footers and
        // invitations write them ("Am Kirchberg 14 · 79336 Herbolzheim",
        // "Avda. del Port 118, 4.º B, 46023 València", "Località Poggio
        // alle Mura 17, 53024 Montalcino"; "Sold 7, 10000 Units" is none).
        rule(
            "postal-address",
            r"\b(?:Am|An der|Auf der|Im|In der|Zum|Zur|Località|Loc\.|Frazione|Fraz\.|Contrada|Strada|Vicolo|Via|Viale|Corso|Piazza|Avda\.|Avenida|Calle|Camino|Carrer|Passeig|Plaza|Rua|Travessa|Largo|Rue|Route|Chemin|Allée|Place)\s(?:[\p{L}'.\-]+\s){0,4}\d{1,4}[a-zA-Z]?\s?[,·–]\s?(?:[^\n,·–]{1,12}[,·–]\s?)?(?:[A-Z]-)?\d{5}\s\p{Lu}\p{Ll}{2,}",
            None,
        ),
        // A Canadian province and postcode; an Indonesian street (Jalan)
        // and number; a Vietnamese house, lane and street or ward (not
        // "đường", also a line or a circle, nor "xã hội", society); a
        // French lieu-dit before its postcode; an Irish unit in a Dublin
        // district. One pattern: one search of the text.
        rule(
            "postal-address",
            r"\b(?:AB|BC|MB|NB|NL|NS|NT|NU|ON|PE|QC|SK|YT)\s{1,2}[ABCEGHJ-NPRSTVXY]\d[A-Z]\s?\d[A-Z]\d\b|\b(?:Jl|Jln|Jalan)\.?\s\p{Lu}[\p{L}.'\- ]{1,40}?\sNo\.?\s?\d{1,4}|(?i:\bsố\s\d{1,4}[a-z]?,?\s(?:ngõ|ngách|hẻm|kiệt|phố)\s|\b\d{1,4}[a-z]?\s(?-i:\p{Lu})[^\n,]{1,30},\s(?:phường\s|xã\s(?-i:\p{Lu}))|\blieu-dit\s[^\n]{1,60}?\b\d{5}\s(?-i:\p{Lu})|\b(?:unit|apt|apartment|flat|suite)\s\d{1,4}[a-z]?,[^\n]{0,60}?,\s{0,2}dublin\s\d{1,2}\b)",
            None,
        ),
        rule(
            "postal-address",
            r"(?i)\b(?:cad\.|caddesi|sok\.|sokak|sokağı|sk\.|bulvarı|blv\.|mah\.|mahallesi)\s{0,3}no\s?:\s?\d{1,5}",
            None,
        ),
        rule(
            "postal-address",
            // After a line's start, a number, a comma or a colon: "عن طريق"
            // is "by means of", and "حي" ends other words.
            r"(?:^|\n|[\d،,:]\s{0,3})(?:شارع|طريق|حي ال)[^\n]{1,60}?\b\d{5}\b",
            None,
        ),
        rule(
            "postal-address",
            r"(?i)(?:\b(?:flat|plot|sector)|फ्लैट|प्लॉट|सेक्टर)\s?(?:no\.?\s?|नं\.?\s?)?\d{1,5}\s?,[^\n]{0,80}?\b\d{3}\s?\d{3}\b",
            None,
        ),
        // Japanese: the postal mark and its 7 digits, or a block number
        // (丁目); Korean: a district (구) and then a road (로, 길) and its
        // number — 로 alone is also a particle ("to").
        // The postal mark and its code, unless a particle follows that
        // asks about the code ("〒150-0043 はどこの地域ですか").
        rule(
            "postal-address",
            r"〒\s?\d{3}-?\d{4}(?:\s{0,2}[^はがの？?\s]|$)",
            None,
        ),
        rule("postal-address", r"\d{1,2}\s?丁目\s?\d{1,4}", None),
        rule(
            "postal-address",
            r"\p{Hangul}+구\s{1,3}\p{Hangul}+(?:로|길)\s?\d{1,4}",
            None,
        ),
        rule(
            "postal-address",
            // `+`, not `{1,32}`: a counted repeat of a Unicode class under
            // (?i) compiles to a 75 ms automaton, paid by every instance of
            // the Spin gateway; the longer words it admits change nothing.
            // "Via" only capitalised: "sent via email, 12 replied" is English.
            r"(?i)\b(?:calle|avenida|av\.|plaza|paseo|carrer|rua|(?-i:Via|VIA)|viale|corso|piazza|rue|boulevard|chemin)\s{1,3}(?:[\p{L}.'\-]+,?\s{1,3}){0,5}\d{1,4}\b",
            None,
        ),
        // A date after a birth word: numeric (14.03.1978, 1978-03-14,
        // 1990年3月5日), Spanish and Portuguese "12 de marzo de 1980",
        // Korean, English "March 3rd, 1990", and a day, a word and a year
        // in any language and separator ("7 Mayıs 1992", "12 مارس 1979",
        // "3 मार्च 1987", "04-Mar-1985", "the 2nd of May 1961"): after a
        // birth word, the word between a day and a year is a month (not a
        // range's "and": "born between 1981 and 1996").
        with_context(
            rule(
                "date-of-birth",
                r"(?i)(?:\d{1,4}[./\-年]\s?\d{1,2}[./\-月]\s?\d{1,4}日?|\d{1,2}\s{1,3}de\s{1,3}\p{L}{1,20}\s{1,3}de\s{1,3}\d{4}|(?:^|[^0-9])(?:0?[1-9]|[12]\d|3[01])\.?(?:st|nd|rd|th)?(?:\s{1,3}of)?[\s\-/.]{1,3}[\p{L}\p{M}]{3,12}\.?,?[\s\-/.]{1,3}(?:1[89]|20)\d{2}|\d{4}년\s?\d{1,2}월\s?\d{1,2}일|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s{1,3}\d{1,2}(?:st|nd|rd|th)?,?\s{1,3}\d{4})",
                Some(not_a_range),
            ),
            r"born|birth|dob|d\.o\.b|birthday|geboren|geburt|geb\.|né le|née le|naissance|nacimiento|nació|f\.\s?nac|\bnac\.|(?-i:[Nn]at[oa])\s(?:il|a|ad)\b|\bnée?\s(?:à|a)\s|\bnacid[oa]\b|nascita|nascimento|nascido|nascida|geboorte|född|født|fødd|urodzon|urodzenia|\bur\.|narozen|\bnar\.|rođen|syntyn|syntymä|doğum|рожден|родил|जन्म|डीओबी|ngày sinh|tanggal lahir|تاريخ الميلاد|مواليد|ولدت|ولد في|وُلد|出生|生日|生于|生年月日|생년월일|생일|출생",
        ),
        // Born, said after the date: "1995년 12월 3일생", "昭和35年2月14日生",
        // "1990年3月5日出生".
        rule(
            "date-of-birth",
            r"\d{4}년\s?\d{1,2}월\s?\d{1,2}일\s?생|(?:明治|大正|昭和|平成|令和)?\d{1,4}年\s?\d{1,2}月\s?\d{1,2}日\s?(?:生|出生)",
            None,
        ),
        // A CV's "b. 09.11.1983" (lower case, as a separate word, the date
        // at once; "b." also letters a list, which has an "a." before).
        unless(
            rule(
                "date-of-birth",
                r"(?:^|[\s·,(|;])b\.\s{0,2}(?:\d{1,2}[./\-]\d{1,2}[./\-](?:19|20)\d{2}|(?:19|20)\d{2}-\d{2}-\d{2}|\d{1,2}\s[\p{L}]{3,12}\.?,?\s(?:19|20)\d{2})",
                None,
            ),
            r"\ba\.\s",
        ),
        // The machine-readable zone of a passport's page (its second line,
        // with check digits): a passport, and the holder's date of birth.
        rule("passport", MRZ_LINE, Some(v::mrz_line)),
        rule("date-of-birth", MRZ_LINE, Some(v::mrz_line)),
        // Not right after a word that makes it a version ("firmware
        // 2.4.1.7", "version 1.0.0.12", "upgrade to 3.2.1.2") or a
        // document's numbering ("section 4.2.1.3"); "build", "release" and
        // "updated to" may name a server as well, so they do not excuse
        // one. A network
        // written with its prefix and no host bits ("10.0.0.0/16") is not
        // an address.
        unless(
            rule(
                "ip-address",
                r"(?:^|[^0-9A-Za-z.])(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}(?:/\d{1,2})?)(?:[^0-9A-Za-z.]|\.(?:\s|$)|$)",
                Some(v::ip_address),
            ),
            r"(?:\b(?:version|ver\.?|firmware|versión|versão|versione|(?:upgrad|downgrad)(?:e|ed|ing)?\s+to|section|clause|chapter|paragraph|para\.|article|art\.|abschnitt|kapitel|chapitre|apartado|capítulo|sezione|capitolo)|§|固件|版本|章节)\s{0,3}[:#]?\s{0,3}$",
        ),
        rule(
            "ip-address",
            r"(?i)(?:^|[^0-9a-f:])(?:[0-9a-f]*:)?(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}(?:[^0-9a-z:]|:[^0-9a-f]|:?$)|\b(?:[0-9a-f]{1,4}:){1,6}:(?:[0-9a-f]{1,4}:?){1,6}\b",
            None,
        ),
        rule(
            "mac-address",
            // Not six pairs out of a longer run: a certificate's SHA-1
            // fingerprint is twenty. A label's colon may come before it
            // ("MAC-Adresse:e6:63:…", "MAC地址：3E-F6-…").
            r"(?i)(?:^|[^0-9a-f:\-])(?:[0-9a-f]*[:\-])?([0-9a-f]{2}(?:[:\-][0-9a-f]{2}){5})(?:[^0-9a-z:\-]|[:\-][^0-9a-f]|[:\-]?$)",
            None,
        ),
        // Cisco's dotted form (3e4e.6bcc.ae89): after the word, or with a
        // letter in it anywhere (a table's header may be far above; a
        // VMware MAC, 0050.5612.3456, may have none); twelve hex digits
        // bare right after the word ("MAC BE70071480C5", a sticker), not a
        // container id later in a sentence about a Mac.
        with_context(
            rule(
                "mac-address",
                r"(?i)\b[0-9a-f]{4}\.[0-9a-f]{4}\.[0-9a-f]{4}\b",
                None,
            ),
            r"\bmac\b",
        ),
        rule(
            "mac-address",
            r"(?i)\b([0-9a-f]{4}\.[0-9a-f]{4}\.[0-9a-f]{4})\b",
            Some(hex_with_letter),
        ),
        rule(
            "mac-address",
            r"(?i)\bmac(?:[ \-]?address)?\s?[:=]?\s{0,2}([0-9a-f]{12})(?:[^0-9a-z]|$)",
            Some(hex_with_letter),
        ),
        // Secrets: the providers' documented key formats.
        rule(
            "api-key",
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
            None,
        ),
        rule("api-key", r"\bgh[pousr]_[A-Za-z0-9]{30,255}\b", None),
        rule("api-key", r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b", None),
        rule("api-key", r"\bglpat-[A-Za-z0-9_\-]{20,256}\b", None),
        rule("api-key", r"\bxox[abposr]-[A-Za-z0-9\-]{10,256}\b", None),
        rule(
            "api-key",
            r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,512}\b",
            None,
        ),
        rule("api-key", r"\bsk-[A-Za-z0-9_\-]{20,256}", None),
        rule("api-key", r"\bAIza[0-9A-Za-z_\-]{35}\b", None),
        rule("api-key", r"\b(?:SK|AC)[0-9a-fA-F]{32}\b", None),
        rule(
            "api-key",
            r"\bSG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}\b",
            None,
        ),
        rule("api-key", r"(?i)AccountKey=[A-Za-z0-9+/=]{40,}", None),
        rule("api-key", r"\bnpm_[A-Za-z0-9]{36}\b", None),
        rule("api-key", r"\bhf_[A-Za-z0-9]{30,256}\b", None),
        // More providers' documented token prefixes, as one pattern (one
        // search per text, not one per provider): PyPI, HashiCorp Vault,
        // DigitalOcean, Shopify, Databricks, Stripe webhooks, Telegram
        // bots, Linear, Postman, Grafana, New Relic, Square, Mailgun,
        // Supabase, Doppler, GitLab's other tokens, Replicate, Groq,
        // Perplexity, xAI, Google OAuth client secrets.
        rule(
            "api-key",
            r"\b(?:pypi-AgE[A-Za-z0-9_\-]{50,}|hvs\.[A-Za-z0-9_\-]{24,}|do[opr]_v1_[a-f0-9]{64}|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}|dapi[a-f0-9]{32}|whsec_[A-Za-z0-9+/]{32,}|[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}|lin_api_[A-Za-z0-9]{40}|PMAK-[a-f0-9]{24}-[a-f0-9]{34}|glsa_[A-Za-z0-9]{32}_[a-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}|NRAK-[A-Z0-9]{27}|sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,43}|key-[0-9a-f]{32}|sbp_[a-f0-9]{40}|dp\.(?:st|ct|sa|pt)\.[A-Za-z0-9_\-]{40,44}|gl(?:ptt|dt|rt|cbt|ft|imt|oas|soat)-[A-Za-z0-9_\-]{20,}|r8_[A-Za-z0-9]{37}|gsk_[A-Za-z0-9]{52}|pplx-[A-Za-z0-9]{48}|xai-[A-Za-z0-9]{80}|GOCSPX-[A-Za-z0-9_\-]{28})\b",
            None,
        ),
        rule(
            "private-key",
            r"-----BEGIN (?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY(?: BLOCK)?-----",
            None,
        ),
        rule(
            "jwt",
            r"\beyJ[A-Za-z0-9_\-]{8,4096}\.eyJ[A-Za-z0-9_\-]{8,4096}\.[A-Za-z0-9_\-]{8,4096}",
            None,
        ),
        rule(
            "password",
            r"(?i)\b[a-z][a-z0-9+.\-]{0,32}://[^\s:/@]{1,256}:([^\s@/]{3,256})@",
            Some(not_placeholder),
        ),
        // Assigned: "password: S3cret!", "PWD=…". The next word on the
        // line, if any, comes along for the check: "Password: must be 12
        // characters" is a rule about passwords, not one.
        rule(
            "password",
            r#"(?i)(?:password|passwd|pwd|passwort|kennwort|mot de passe|contraseña|senha|wachtwoord|hasło|haslo|şifre|sifre|lösenord|losenord|passord|adgangskode|heslo|salasana|密码|口令|पासवर्ड|كلمة المرور|كلمة السر)\*{0,2}\s*["']?\s*[=:：]\*{0,2}\s*["'`]?([^\s"'`,;]{4,256}(?:[ \t]+[^\s"'`,;]{1,64})?)"#,
            Some(assigned_password),
        ),
        // Every quoted literal on the rest of the line of a password's
        // assignment whose value is code: a default (`os.getenv(
        // "DB_PASSWORD", "Pr0d-S3cret!")`, `process.env.PW ??
        // `Winter2024!``), an encoded or hashed one (`b64decode("…")`,
        // `sha256(b"…")`), a keyword argument among others. A variable's
        // name (`"DB_PASSWORD"`), a URL, a date and an encoding are none.
        rule(
            "password",
            r#"(?i)(?:password|passwd|pwd|passwort|kennwort)[a-z0-9_]*["']?\s*[=:]([^\n]{1,160})"#,
            Some(literal_password),
        ),
        // Changed to: "I changed the password to Tulip#2024", "we reset all
        // user passwords to …", "change the password for the router to …".
        rule(
            "password",
            r#"(?i)\b(?:chang(?:e|ed|es|ing)|set(?:s|ting)?|reset(?:s|ting)?|updat(?:e|ed|es|ing))(?:\s+[^\s,;:.]{1,20}){0,4}?\s+(?:password|passwd|passcode|passphrase)s?(?:\s+(?:for|on|of)(?:\s+[^\s,;:.]{1,20}){1,3}?)?\s+to(?:\s+be)?\s*:?\s*["'`«“„]?([^\s"'`»”“,;]{4,64})"#,
            Some(literal_value),
        ),
        // Said rather than assigned: "my password is hunter2", "le mot de
        // passe est Soleil42", "パスワードは abc123!", also with what it
        // is for in between ("the password for the router is …", "la
        // password del wifi di casa è …", "lösenordet till wifi är …",
        // "hasło do wifi: …"), the word and a Hindi "है" after it, the word's definite or possessive
        // form and the language's "is" ("lösenordet är …", "şifresi …",
        // "heslo je …", "hasło to …", "पासवर्ड है …", "كلمة المرور هي …"). Only a value with a digit or a
        // symbol counts ("the password is incorrect" is not one).
        rule(
            "password",
            r#"(?i)(?:\b(?:password|passwd|passcode|passphrase|clave(?:\s+(?:del?|de la))?\s+(?:wifi|wi-fi|red|router|acceso)|mot de passe|passwort|kennwort|contraseña|senha|wachtwoord|hasło(?:\s+(?:to|jest))?|hasło\s+(?:do|dla|od)(?:\s+[^\s,;:]{1,20}){1,4}?\s+to|lösenord(?:et)?(?:\s+är)?|passord(?:et)?(?:\s+er)?|adgangskode(?:n)?(?:\s+er)?|heslo(?:\s+je)?|salasana(?:\s+on)?|kata sandi)|şifre(?:si|niz|m)?|mật khẩu|пароль|パスワード|비밀번호|密码|口令|पासवर्ड(?:\s+है)?|كلمة (?:المرور|السر)(?:\s+(?:هي|هو))?)(?:(?:\s+(?:(?:for|of|to|on|van|voor|del|della|dello|di|für|vom|von|du|de|des|da|do|till|för|til|dla|pro)\b|от|для)(?:\s+[^\s,;:]{1,20}){1,4}?|\s+ل[^\s,;:]{1,20}(?:\s+[^\s,;:]{1,20}){0,3}?)(?:\s+(?:is|was|ist|lautet|est|c['’]est|es|é|è|era|är|er|je|jest|это|هي|هو|[—–-])|\s*[:：]))?(?:\s+(?:i|we|you|they)\s+(?:set|used|chose|picked|created|made|had|gave\s+(?:you|him|her|them)))?\s{0,3}(?:[:：]\s{0,3})?(?:is|was|ist|lautet|est|c['’]est|es|é|è|är|je|jest|adalah|ialah|là|это|は|는|은|是|为|है|هي|هو)?\s{0,3}(?:(?:now|still|set to|changed to|definitely|actually|just|really|literally|probably)\s{1,3})?["'«“„]?([^\s"'»”“,;]{4,64})"#,
            Some(said_password),
        ),
        // Indonesian and Vietnamese name what it is for with no
        // preposition ("kata sandi wifi kantor adalah …", "passwordnya
        // adalah …", "mật khẩu wifi là …"): a rule of its own, so that a
        // value said before a later "adalah" is still tried by the rule
        // above.
        rule(
            "password",
            r#"(?i)(?:\b(?:kata sandi|sandi|password)(?:nya)?(?:\s+[^\s,;:]{1,20}){0,5}?\s+(?:adalah|ialah)|mật khẩu(?:\s+[^\s,;:]{1,20}){0,4}?\s+là)\s{1,3}["'“]?([^\s"'”,;]{4,64})"#,
            Some(said_password),
        ),
        // The short forms (pw, pwd, mdp) only with a colon, an equals
        // sign or the language's "is" after them: alone they are also
        // `pwd.h`, a PW1100G engine and a Markov decision process.
        rule(
            "password",
            r#"(?i)\b(?:pw|pwd|mdp)\b(?:\s+(?:for|of|de|du|des|del|für)\b(?:\s+[^\s,;:=]{1,20}){1,4}?)?\s{0,3}(?:[:：=]|\bis\b|\bwas\b|c['’]est\b|\best\b|\bes\b|\bist\b)\s{0,3}["'«“„]?([^\s"'»”“,;]{4,64})"#,
            Some(said_password),
        ),
        // A user and password on a command line: `curl -u deploy:S3cret`,
        // `--user name:pw` (curl, wget, httpie).
        rule(
            "password",
            r#"(?:^|\s)(?:-u|--user|--http-user)[ =]["']?([^\s:"'$]{1,64}:[^\s"']{3,256})"#,
            Some(user_password),
        ),
        // A password on a database client's command line (`mysqldump -u
        // backup -p'Bk!22'`, `sshpass -p …`), in a Wi-Fi QR code's text
        // (`WIFI:T:WPA;S:Net;P:…;;`), and a Kubernetes secret's password
        // printed by `base64 -d` on the line after.
        rule(
            "password",
            r#"\b(?:mysql(?:dump|admin|import|check|sh|slap)?\b[^\n]{0,120}?\s-p|sshpass\s+-p\s?)["']?([^\s"']{3,128})"#,
            Some(not_placeholder),
        ),
        // Redis's config (`requirepass …`, `masterauth …`): a line of its
        // own, as the file has it; "the requirepass setting" is talk.
        rule(
            "password",
            r#"(?m)^[ \t]*(?:requirepass|masterauth)[ \t]+["']?([^\s"']{3,128})["']?[ \t]*\r?$"#,
            Some(not_placeholder),
        ),
        rule(
            "password",
            r"WIFI:(?:[^\n]{0,200}?;)?P:([^;\n]{4,128});",
            Some(not_placeholder),
        ),
        with_context(
            rule(
                "password",
                r"base64\s+(?:-d|--decode|-D)\b[^\n]{0,80}\n\s{0,8}([^\s$][^\s]{3,255})[ \t]*(?:\n|$)",
                Some(said_password),
            ),
            r"pass|pwd",
        ),
        // A random-looking value assigned to a secret's name, on its line
        // or alone on the next (`client_secret:\n  9f8e…`), in Go's `:=`
        // and in a YAML list (`auth_token: ['…']`) too, and a camelCase
        // key (`primaryKey`, Azure's). A key that names a record rather
        // than opening anything (`idempotency_key=<uuid>`, `cache_key`,
        // `sortKey`) and a public key are no secret's name.
        unless(
            rule(
                "secret",
                r#"(?i)\b[a-z0-9_\-]{0,64}(?:secret|token|api_?key|apikey|access_?key|private_?key|auth_?key|credential|passphrase|_key|(?-i:[a-z]Key)|_pass)[a-z0-9_\-]{0,64}["']?[ \t]*(?::=|[=:])[ \t]*\[?((?:\r?\n[ \t]*)?["']?[^\s"'`,;]{16,512})"#,
                Some(secret_value),
            ),
            r#"(?:\b|_)(?:idempotency|cache|foreign|sort|partition|range|dedupe?|row|object|lookup|routing|correlation|shard|index|translation|i18n|public)[_\-]?key["']?[ \t]*(?::=|[=:])[ \t]*\[?$"#,
        ),
        // A secret given to a command's flag (`--token hf_…`,
        // `--api-key=…`) or an Android manifest's value under a key's name.
        rule(
            "secret",
            r#"(?i)(?:^|\s)--?[a-z0-9\-]{0,32}(?:token|secret|api-?key|access-?key|auth-?key)[a-z0-9\-]{0,32}(?:\s+|=)["']?([^\s"'$\-][^\s"']{15,511})"#,
            Some(v::high_entropy),
        ),
        rule(
            "secret",
            r#"(?i)android:name\s*=\s*"[^"]{0,128}(?:key|secret|token)[^"]{0,128}"\s*android:value\s*=\s*"([^"]{16,512})""#,
            Some(v::high_entropy),
        ),
        // An HTTP credential pasted with its header: an opaque bearer
        // token (a JWT is found as one already), or Basic's base64 of
        // user:password.
        rule(
            "secret",
            r"(?i)\bbearer\s+([A-Za-z0-9._~+/\-]{20,512}=*)",
            Some(v::high_entropy),
        ),
        rule(
            "secret",
            r"(?i)\bauthorization:\s*basic\s+([A-Za-z0-9+/]{8,512}={0,2})",
            None,
        ),
    ];
    // A provider's key format filled with one character or marked as the
    // provider's documentation example is a placeholder, not a key.
    rules
        .into_iter()
        .map(|r| match r.kind {
            "api-key" if r.check.is_none() => Rule {
                check: Some(not_an_example_key),
                ..r
            },
            _ => r,
        })
        .collect()
}

/// Not a documentation example ("AKIAIOSFODNN7EXAMPLE", AWS's) nor a
/// format filled in with a placeholder character ("sk_test_xxxxxxxx…",
/// "ghp_0000…"): eight of `x`, `0`, `*`, `#` or `.` in a row. A random key
/// has such a run about once in 10^8 (hex) or far less.
fn not_an_example_key(s: &str) -> bool {
    let mut run = (None, 0);
    for c in s.chars() {
        run = if run.0 == Some(c) {
            (run.0, run.1 + 1)
        } else {
            (Some(c), 1)
        };
        if run.1 >= 8 && "xX0*#.".contains(c) {
            return false;
        }
    }
    !s.to_ascii_uppercase().contains("EXAMPLE")
}

/// Hex digits that hold a letter and a digit: a MAC address's, not a
/// number's ("2024.1105.0930") nor a word's.
fn hex_with_letter(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_alphabetic()) && s.chars().any(|c| c.is_ascii_digit())
}

/// A UK postcode's outward code starts with a known letter and the inward
/// code's letters avoid C, I, K, M, O, V.
fn uk_postcode_shape(s: &str) -> bool {
    let chars: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
    let inward = &chars[chars.len().saturating_sub(3)..];
    !inward.iter().skip(1).any(|c| "CIKMOV".contains(*c))
        && !chars.first().is_some_and(|c| "QVX".contains(*c))
}

/// Two capitals before a ZIP code are a US state (or DC, PR).
fn us_state(s: &str) -> bool {
    const STATES: &str = "AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY DC PR";
    STATES.split(' ').any(|state| s.starts_with(state))
}

/// A phone number after a phone word, unless its digits are a date with
/// its year ("2024.01.15", "15.01.2024") or start with one.
fn phone_not_date(s: &str) -> bool {
    // A middle dot also lists things ("090・080・070"): a number written
    // with them ends in four digits (03・7447・0155).
    let listed = s.contains(['・', '·'])
        && s.rsplit(['・', '·'])
            .next()
            .is_none_or(|last| last.trim().len() != 4);
    // A timestamp starts with its date ("2024-11-05 14:32").
    let stamped = s.get(..10).is_some_and(is_dated);
    v::phone_digits(s) && !is_dated(s) && !stamped && !listed
}

/// Three groups of digits that are a date: a year of 19xx or 20xx first
/// or last, and a day and a month (either order) that can be one.
/// "0711 12 34" is no date.
fn is_dated(s: &str) -> bool {
    let groups: Vec<&str> = s
        .split(['.', '-', '/', ' '])
        .filter(|g| !g.is_empty())
        .collect();
    let small = |g: &str| {
        (1..=2).contains(&g.len()) && g.parse::<u32>().is_ok_and(|n| (1..=31).contains(&n))
    };
    let year = |g: &str| g.len() == 4 && g.parse::<u32>().is_ok_and(|y| (1900..2100).contains(&y));
    let month = |g: &str| small(g) && g.parse::<u32>().is_ok_and(|n| n <= 12);
    let day_and_month = |a: &str, b: &str| small(a) && small(b) && (month(a) || month(b));
    match groups[..] {
        [y, a, b] if year(y) => day_and_month(a, b),
        [a, b, y] if year(y) => day_and_month(a, b),
        _ => false,
    }
}

/// A secret's value: random-looking; and when it stands alone on the
/// line after its name (`client_secret:\n  9f8e…`), not another setting
/// (`KEY=\nOTHER=…`: an empty setting before the next — a name, then `=`
/// or `:` and more than base64's padding).
fn secret_value(s: &str) -> bool {
    let next_line = s.starts_with(['\r', '\n']);
    let value = s.trim_start().trim_start_matches(['"', '\'']);
    if next_line {
        let name_end = value
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-'))
            .unwrap_or(value.len());
        let rest = &value[name_end..];
        let setting = value.starts_with(|c: char| c.is_ascii_alphabetic())
            && rest.starts_with(['=', ':'])
            && !rest.chars().all(|c| c == '=');
        if setting {
            return false;
        }
    }
    // AWS's documented examples (`AKIAIOSFODNN7EXAMPLE`,
    // `wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY`), not any value with
    // "example" in its run (`…&redirect_uri=https://app.example.com`).
    let example = value.ends_with("EXAMPLE") || value.contains("EXAMPLEKEY");
    v::high_entropy(value) && !example
}

/// A day, a word and a year whose word joins two numbers rather than
/// naming a month ("between 2 and 2019", "1 to 2020").
fn not_a_range(s: &str) -> bool {
    const JOINING: &[&str] = &[
        "and", "und", "och", "oder", "bis", "till", "tot", "per", "from", "to", "or", "und",
    ];
    !s.split(|c: char| !c.is_alphabetic())
        .any(|word| JOINING.contains(&word.to_lowercase().as_str()))
}

/// Groups of digits that are a date with its year ("opened 2023-10-05",
/// "05-10-2023") are not an account number. (A sort code, 12-34-56, has
/// no year and stays one.)
fn not_a_date(s: &str) -> bool {
    !is_dated(s)
}

/// A password someone wrote out in a sentence: not a placeholder, starting
/// like a word or number, with a digit or a symbol in it (so "is
/// incorrect", "(at least 12 characters)" and "reset" are not), and not
/// one hyphenated word ("is case-sensitive"; a passphrase of more words,
/// "correct-horse-battery-staple", still counts).
fn said_password(s: &str) -> bool {
    // "password hashing:" names a topic; "Passwort WLAN: Sonne7" names
    // what the password is for, and the rule finds its colon as the symbol.
    if s.strip_suffix(':')
        .is_some_and(|w| PASSWORD_TOPICS.contains(&w.to_lowercase().as_str()))
    {
        return false;
    }
    let s = s.trim_end_matches(['.', '!', '?', ')']);
    s.chars().count() >= 4
        && s.chars().next().is_some_and(char::is_alphanumeric)
        && s.chars()
            .any(|c| c.is_ascii_digit() || c.is_ascii_punctuation())
        && !compound_word(s)
        && !length_range(s)
        && !config_reference(s)
        && not_placeholder(s)
}

/// The value of "password: VALUE [next word]" is a password unless it
/// reads as a rule about passwords: a word that starts a sentence with
/// more words after it ("must be", "mindestens 8", "rotate on"; another
/// plain word followed by more is still a password: `--password=secretpw
/// -h db`), a length range ("8-64 characters"), a YAML tag (`!vault`), a
/// path (`pwd: /home/…`, the shell's working directory), or a placeholder.
fn assigned_password(s: &str) -> bool {
    // A shell's default (`${DB_PASSWORD:-Pr0d-S3cret!}`, the rule finding
    // the colon): the default is the password, if it reads as one
    // (`${DB_PASSWORD:-请替换}`, "please replace", does not).
    // What follows the brace must not go on with the value:
    // "password: -Kp}7#zQ" is a password.
    if let Some((default, rest)) = s.strip_prefix('-').and_then(|d| d.split_once('}'))
        && !rest.starts_with(|c: char| c.is_ascii_graphic())
    {
        return said_password(default);
    }
    let (value, next) = match s.split_once([' ', '\t']) {
        Some((value, next)) => (value, Some(next.trim())),
        None => (s, None),
    };
    let word = value
        .trim_end_matches(['.', ':', '!', '?', ')'])
        .to_lowercase();
    let sentence = SENTENCE_WORDS.contains(&word.as_str()) && next.is_some_and(|n| !n.is_empty());
    let yaml_tag = value.len() > 1
        && value.starts_with('!')
        && value[1..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_');
    let path = (value.starts_with('/') || value.starts_with("~/")) && value[1..].contains('/');
    let where_it_is = WHERE_WORDS.contains(&value)
        && next.is_some_and(|n| {
            let first = n.split_whitespace().next().unwrap_or("").to_lowercase();
            WHERE_NEXT.contains(&first.as_str())
        });
    let not_a_value =
        sentence || where_it_is || length_range(&word) || yaml_tag || path || code_reference(value);
    !not_a_value && value.chars().count() >= 4 && not_placeholder(value) && not_placeholder(&word)
}

/// Code that reads a password from somewhere rather than a password:
/// a dotted name called or indexed (`os.environ["DB_PASSWORD"]`,
/// `models.CharField(max_length=128)`), a name called or indexed right
/// before a quote (`getenv("PW")`: the value stops at the quote), or
/// `process.env.…`. "Abc(123" is still a password; a literal later on the
/// line (a default, an encoded password) is the next rule's.
fn code_reference(value: &str) -> bool {
    let name_end = value
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(value.len());
    let (name, rest) = value.split_at(name_end);
    let is_name = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    let opens = rest.starts_with(['(', '[']);
    (is_name && opens && (name.contains('.') || rest.len() == 1))
        || value.starts_with("process.env.")
        || config_reference(value)
}

/// A setting read from the configuration rather than written in it:
/// Terraform's `var.db_password`, `settings.DB_PASSWORD`, `config.db.pw`
/// — a dotted name, without digits, under a namespace code reads
/// settings from.
fn config_reference(value: &str) -> bool {
    const NAMESPACES: &[&str] = &[
        "var", "local", "data", "module", "each", "self", "config", "settings", "secrets", "env",
        "vars", "params", "props", "this", "ctx", "args", "opts", "options", "cfg", "conf",
    ];
    let value = value.trim_end_matches([',', ';']);
    // "this.is.Sparta" is a passphrase: the last name must read as a
    // setting's (`db_password`, `DB_PASSWORD`, `pw`).
    let setting = |name: &str| {
        let lower = name.to_ascii_lowercase();
        name.contains('_')
            || (name.len() > 1 && name.bytes().all(|b| b.is_ascii_uppercase()))
            || ["pass", "pw", "pwd", "secret", "token", "key", "cred"]
                .iter()
                .any(|w| lower.contains(w))
    };
    value.split_once('.').is_some_and(|(head, rest)| {
        NAMESPACES.contains(&head)
            && rest.rsplit('.').next().is_some_and(setting)
            && rest.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphabetic() || c == '_')
            })
    })
}

/// `user:password` on a command line, unless the password is a
/// variable, a placeholder or a path (`rsync -u host:/srv`), or the pair
/// is a user and group (`docker run -u 1000:1000`, `--user
/// www-data:www-data`).
fn user_password(s: &str) -> bool {
    let Some((user, password)) = s.split_once(':') else {
        return false;
    };
    let numeric = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let user_and_group = user == password || (numeric(user) && numeric(password));
    !user_and_group
        // A leading `$` (a variable) is `not_placeholder`'s.
        && !password.starts_with('/')
        && not_placeholder(password)
        && !code_reference(password)
}

/// Some quoted literal in the rest of a password's line is one: said
/// like one ([`literal_value`]) and not a variable's name (an identifier
/// with an underscore or in capitals only: `DB_PASSWORD`, `PGPASSWORD`),
/// a URL, a date or an encoding.
fn literal_password(rest: &str) -> bool {
    static LITERAL: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r#"["'`]([^"'`\s]{4,128})["'`]"#).expect("quoted literal")
    });
    LITERAL.captures_iter(rest).any(|c| {
        let s = &c[1];
        let identifier = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let name = identifier && (s.contains('_') || s.chars().all(|c| c.is_ascii_uppercase()));
        let lower = s.to_ascii_lowercase();
        let other = lower.contains("://")
            || is_dated(s.split('T').next().unwrap_or(s))
            || ["utf-8", "utf8", "ascii", "latin-1", "iso-8859-1"].contains(&lower.as_str());
        !name && !other && literal_value(s)
    })
}

/// A value written out as a password: [`said_password`], or one that
/// starts with a symbol and has a letter and a digit ("!QAZ2wsx",
/// "@dm1n2024").
fn literal_value(s: &str) -> bool {
    said_password(s)
        || (s.starts_with(|c: char| c.is_ascii_punctuation())
            && s.chars().any(|c| c.is_alphabetic())
            && s.chars().any(|c| c.is_ascii_digit())
            && not_placeholder(s))
}

/// What a heading about passwords names ("Password hashing:", "Password
/// policy:"), not what a password is for.
const PASSWORD_TOPICS: &[&str] = &[
    "hashing",
    "hash",
    "policy",
    "policies",
    "requirements",
    "rules",
    "manager",
    "managers",
    "reset",
    "strength",
    "length",
    "storage",
    "complexity",
    "security",
    "generator",
    "expiry",
    "rotation",
];

/// Words a rule about passwords starts with ("Password: must be …").
const SENTENCE_WORDS: &[&str] = &[
    "must",
    "should",
    "needs",
    "need",
    "has",
    "have",
    "is",
    "are",
    "can",
    "cannot",
    "will",
    "may",
    "min",
    "minimum",
    "max",
    "maximum",
    "at",
    "between",
    "rotate",
    "rotated",
    "expires",
    "change",
    "changed",
    "reset",
    "enter",
    "use",
    "contains",
    "mindestens",
    "muss",
    "soll",
    "doit",
    "au",
    "entre",
    "debe",
    "mínimo",
    "deve",
    "pelo",
];

/// Where a password is, not what it is: "Password: printed on the
/// label", "sent separately". Only in lower case and before a word that
/// says where ([`WHERE_NEXT`]): "password: Under Pressure" is one.
const WHERE_WORDS: &[&str] = &[
    "printed", "written", "shown", "sent", "attached", "provided", "given", "listed", "stored",
    "kept", "below", "above", "under",
];
const WHERE_NEXT: &[&str] = &[
    "on",
    "in",
    "at",
    "by",
    "via",
    "to",
    "with",
    "from",
    "under",
    "inside",
    "below",
    "above",
    "separately",
    "elsewhere",
    "here",
    "there",
    "the",
];

/// A length rule's range ("8-64" characters).
fn length_range(s: &str) -> bool {
    s.split_once(['-', '–']).is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_digit()))
    })
}

/// Two words joined by one hyphen ("case-sensitive", "well-known").
fn compound_word(s: &str) -> bool {
    s.split_once('-').is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|w| !w.is_empty() && w.chars().all(char::is_alphabetic))
    })
}

/// A form's hint in Chinese or Japanese ("密码：请输入8-20位",
/// "パスワード：半角英数字8文字以上"): no space ends its first word, so
/// the hint is one only without Latin letters after it ("密码：请使用
/// Abc@12345登录" holds the password).
fn form_hint(s: &str) -> bool {
    const HINTS: &[&str] = &[
        "请",
        "請",
        "需",
        "须",
        "須",
        "必须",
        "至少",
        "不少于",
        "长度",
        "半角",
        "入力",
    ];
    HINTS.iter().any(|w| s.starts_with(w)) && !s.chars().any(|c| c.is_ascii_alphabetic())
}

/// "password: ****", "password = <your password>", "password: string"
/// and "密码：请输入…" are instructions, not secrets.
fn not_placeholder(s: &str) -> bool {
    let variable = s.starts_with(['<', '{', '$']);
    // Inside the quotes of a language that are not ASCII («********»); a
    // variable only unquoted: „$ommer2024“ is a password.
    let s = s.trim_matches(['«', '»', '“', '”', '„', '‘', '’', '「', '」']);
    let lower = s.to_lowercase();
    // A form's blank to fill in ("____", "-----", "*****", "xxxx").
    let blank = |fill: char| s.chars().all(|c| c == fill);
    !(s.chars()
        .all(|c| c == '*' || c == 'x' || c == 'X' || c == '.')
        || blank('_')
        || blank('-')
        || variable
        || form_hint(s)
        || [
            "string",
            "password",
            "your_password",
            "null",
            "none",
            "changeme",
            "example",
            "required",
            "optional",
            "hidden",
            "masked",
            "redacted",
            "empty",
            "blank",
            "unset",
            "obligatoria",
            "obligatorio",
            "obligatoire",
            "erforderlich",
        ]
        .contains(&lower.as_str()))
}
