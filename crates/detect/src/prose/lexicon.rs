//! The weighted lexicon: a marking alone is enough (weight 1), a topic
//! word counts half, and the text is confidential when the sum reaches
//! `[guard] prose_threshold` (default 1: one marking, or two topic words).

use regex::{Regex, RegexSet};
use std::sync::LazyLock;

/// Every term in one automaton: a scan touches one set of tables, not a
/// hundred regexes' (each with its own, cold after the last request —
/// most of a short prompt's detection time was that).
struct Lexicon {
    terms: RegexSet,
    /// Each term's weight, by its index in `terms`.
    weights: Vec<f32>,
}

fn terms(weight: f32, words: &[&str]) -> Vec<(String, f32)> {
    words
        .iter()
        .map(|w| {
            // Word-bounded for Latin scripts (ASCII boundaries: a DFA can
            // run them over any text, and a letter outside ASCII beside a
            // term only makes a match likelier); CJK has no spaces to
            // bound.
            let pattern = if w.is_ascii() {
                format!(r"(?i)(?-u:\b){w}(?-u:\b)")
            } else {
                format!("(?i){w}")
            };
            (pattern, weight)
        })
        .collect()
}

static LEXICON: LazyLock<Lexicon> = LazyLock::new(|| {
    let mut all = terms(
        1.0,
        &[
            "confidential",
            "strictly private",
            "internal only",
            "internal use only",
            "do not (?:share|distribute|forward)",
            "not for distribution",
            "under (?:an )?nda",
            // The marking; the doctrine's name alone ("explain
            // attorney-client privilege") is a topic word below.
            "attorney-client privileged",
            "(?:protected by|subject to|covered by) (?:the )?attorney-client privilege",
            "privileged and confidential",
            // With its endings: "vertrauliche Unterlagen".
            "vertraulich(?:e[mnrs]?)?",
            "streng geheim",
            "nur für den internen gebrauch",
            "confidentiel(?:le)?",
            "usage interne",
            "confidencial",
            "uso interno",
            "riservato",
            "机密",
            "保密",
            "内部资料",
            "仅限内部",
            "社外秘",
            // The marking in more languages: Polish, Swedish, Danish and
            // Norwegian, Dutch, Italian, Czech, Finnish, Russian, Korean,
            // Japanese, Arabic, Hindi, and Turkish's "GİZLİ –" (as a
            // heading only: "gizli" alone is also "hidden").
            "poufn(?:e|y|a|ych)",
            "ściśle tajne",
            "konfidentiell(?:t|a)?",
            // Not "fortrolig med" (familiar with).
            "strengt fortrolig(?:t|e)?",
            "(?:strikt )?vertrouwelijk(?:e)?",
            "confidenziale",
            "důvěrné",
            "luottamuksellinen",
            // Not "конфиденциальности" (privacy).
            "конфиденциально(?:\\s|[:.,!]|$)",
            "для служебного пользования",
            "대외비",
            // Not "기밀성" (confidentiality as a property, airtightness).
            "기밀(?:\\s|[:.,]|$|문서|자료|사항)",
            "극비",
            "極秘",
            "سري للغاية",
            "سري وخاص",
            // Not "गोपनीयता" (privacy: "गोपनीयता नीति", a privacy policy).
            "गोपनीय(?:\\s|[:।,.]|$)",
            "(?:^|\\n)\\s*(?:çok\\s+)?gizli\\s*[:–—\\-]",
            "(?-i:GİZLİ|KİŞİYE ÖZEL|HİZMETE ÖZEL)",
            // Arabic's "secret:" as a heading.
            "(?:^|\\n)\\s*سري\\s*[:–—\\-]",
        ],
    );
    all.extend(terms(
        0.5,
        &[
            // Health.
            "diagnos(?:ed|is)",
            "prescri(?:bed|ption)",
            "chemotherapy",
            "hiv",
            "cancer",
            "tumou?r",
            "depression",
            "anxiety disorder",
            "bipolar",
            "therapist",
            "psychiatri(?:c|st)",
            "blood test",
            "biopsy",
            "medical (?:record|history|condition)",
            "pregnan(?:t|cy)",
            "miscarriage",
            "rehab",
            "diagnose",
            "diagnosti\\w*",
            "diab[eè]t\\w*",
            "cáncer",
            "chemo",
            "haven't told",
            "without telling",
            "don't want (?:my|anyone|them) to know",
            "ne veux pas que",
            "no quiero que",
            "sues?",
            "suing",
            "prime",
            "abfindung",
            "kündigung",
            "krankheit",
            "maladie",
            "enfermedad",
            "诊断",
            "病历",
            "确诊",
            "抑郁",
            "化疗",
            "癌",
            "不想让",
            "降薪",
            "डायबिटीज़",
            "कैंसर",
            "वेतन",
            // Swedish pay (not "lönsam"), Dutch and English burn-out and
            // the company doctor, Swedish sick leave, Arabic cancer, sick
            // leave and salary, Korean salary, pay and layoffs.
            "(?-u:\\b)lön(?:en|er|ehöjning|esamtal\\w*)?(?-u:\\b)",
            "burn-?out",
            "bedrijfsarts",
            "sjukskriv\\w*",
            "سرطان",
            "إجازة مرضية",
            "(?:^|\\s)(?:ال)?راتب",
            "رواتب",
            "연봉",
            "월급",
            "감원",
            // A large sum of money: with one topic word, enough.
            "\\d{1,3}(?:[.,\\s]\\d{3})+\\s?(?:€|euros?|eur|\\$|usd|£|gbp|元|zł|ريال|(?:kr|sek|nok|dkk|pln|chf)(?-u:\\b))",
            // Lira, rupees, yen and won: a million or more.
            "\\d{1,3}(?:[.,\\s]\\d{3}){2,}\\s?(?:₺|₹|円|원|(?:tl|inr)(?-u:\\b))",
            "\\d+(?:\\.\\d+)?万",
            // Money and employment.
            "salary",
            "salaries",
            "compensation",
            "pay (?:rise|raise|cut)",
            "bonus",
            "payroll",
            "layoffs?",
            "redundanc(?:y|ies)",
            "severance",
            "performance review",
            "disciplinary",
            // A performance plan, a warning and a dismissal in Spanish and
            // Turkish; a settlement and non-disclosure in Arabic; a triage
            // note's diagnosis and history.
            "performance improvement plan",
            "amonestación",
            "despido",
            "performans iyileştirme",
            "işine son",
            "işten çıkar\\w*",
            "تسوية",
            "عدم الإفصاح",
            "dx\\s?:\\s?\\w+",
            "hx of",
            // German compounds: Gehaltsliste, Gehälter, Gehaltserhöhung.
            "gehalt\\w*",
            "gehälter\\w*",
            "salaire",
            "sueldo",
            "salario",
            "工资",
            "薪资",
            "薪水",
            "年薪",
            "裁员",
            // Legal.
            "attorney-client privilege",
            "lawsuit",
            "litigation",
            "sued",
            "settlement",
            "subpoena",
            "indictment",
            "grievance",
            "whistleblow(?:er|ing)",
            "klage",
            "procès",
            "demanda",
            "诉讼",
            "起诉",
            // Deals.
            "merger",
            "acquisition",
            "acquire",
            "takeover",
            "term sheet",
            "due diligence",
            "unannounced",
            "not yet public",
            "before (?:the )?announcement",
            "earnings (?:before|ahead)",
            "insider",
            "übernahme",
            "fusion",
            "adquisición",
            "收购",
            "并购",
            "合并",
        ],
    ));
    let (patterns, weights): (Vec<String>, Vec<f32>) = all.into_iter().unzip();
    Lexicon {
        terms: RegexSet::new(&patterns).unwrap_or_else(|e| panic!("prose terms: {e}")),
        weights,
    }
});

/// Phrases that look confidential but are not: a technology's name (in
/// the languages of the markings), a marking named as a word (the word
/// 'confidential', a glossary's « confidentiel », der Vermerk
/// „vertraulich“; after "mark", "label" or "as" only in a question: "mark
/// it as 'confidential'?"; after "and" only in a list of quoted words) —
/// not "treat as 'confidential': …", "est « confidentiel »", a heading or
/// a JSON value, which mark their text — three or more classification
/// levels in a row (a scheme, not a document's level), the duty of
/// confidentiality in Chinese (保密义务: like "confidentiality", which the
/// English marking's word boundary already leaves out; 保密协议, an NDA,
/// still marks), a quoted marking named as a label or banner to add to
/// something ("add an "Internal only" label to pages"; not "add an
/// "Internal only" label: the Q3 layoffs …"), OAuth's confidential and
/// public clients named together (kinds of client, not markings), the
/// standard e-mail disclaimer (on every message, secret or not), a film's
/// title. "Confidential AI" is not excused: it also heads a confidential
/// AI plan.
static NOT_CONFIDENTIAL: LazyLock<Regex> = LazyLock::new(|| {
    // A marking word in quotes.
    const QUOTED: &str = r#"['"‘“«„]\s?(?:confidential|vertraulich|streng\ geheim|confidentiel(?:le)?|confidencial|riservato|internal\ only|usage\ interne|uso\ interno)\s?['"’”»“]"#;
    // Two or more classification levels, each in quotes of any script,
    // joined as a question joins them: 「社外秘」と「極秘」, "Hemlig"
    // jämfört med "Konfidentiell", "سري" و"سري للغاية" — levels asked
    // about, not a document's own.
    const ASKED: &str = r#"['"‘“«„「『]\s?(?:(?:strictly\ |highly\ )?confidential|internal(?:\ only)?|(?:top\ )?secret|restricted|(?:streng\ )?vertraulich|(?:streng\ )?geheim|confidentiel(?:le)?|confidencial|riservat[oa]|riservatissimo|(?:kvalificerat\ )?hemlig|konfidentiell|poufne|(?:ściśle\ )?tajne|社外秘|極秘|部外秘|関係者外秘|机密|秘密|绝密|대외비|극비|기밀|비밀|سري(?:\ للغاية|\ جدا)?|गोपनीय|(?:çok\ )?gizli)\s?['"’”»“」』]"#;
    const LEVEL: &str = r"public|internal(?:\ (?:use\ )?only)?|restricted|(?:highly\ |strictly\ )?confidential|(?:top\ )?secret|unclassified|classified|official";
    Regex::new(
        &r#"(?ix)
        confidential\ (?:computing|vms?|containers?|inference)\b
        | confidential\ clients?\ (?:and|or|vs\.?|versus)\ (?:an?\ )?public\ clients?\b
        | \bpublic\ clients?\ (?:and|or|vs\.?|versus)\ (?:an?\ )?confidential\ clients?\b
        | informatique\ confidentielle | (?:computación|computação)\ confidencial
        | elaborazione\ confidenziale | vertrauliche[sn]?\ (?:rechnen|computing)
        | cancer\ (?:research|awareness|society)
        | 机密计算 | 保密(?:义务|条款|期限|责任|制度|法)
        | (?:\bword|\bterm|\bcalled|\bentre|\bbetween|übersetze|traduis|traduce|translate|\bvermerk|\bmention|\bmot|\bpalabra|\bwort|\bparola|\bwoord|\btermo)
          [^\S\n]+QUOTED(?:[^\S\n]+(?:and|und|et|y|or|oder|ou|o)[^\S\n]+QUOTED)*
        | (?:\bmark(?:ed)?|\blabel(?:led)?|\bas)[^\S\n]+(?:it[^\S\n]+|this[^\S\n]+)?QUOTED[^\n.!:;]{0,40}\?
        | \b(?:add|adding|put|apply|applying|show|display|create|insert|use)[^\S\n]+(?:an?[^\S\n]+|the[^\S\n]+)?QUOTED[^\S\n]+(?:label|tag|banner|stamp|watermark|sticker)s?[^\S\n]+(?:to|on|in|for)\b
        | ['"’”»“][^\S\n]+(?:and|und|et|y|or|oder|ou|o)[^\S\n]+QUOTED
        | \b(?:LEVEL)(?:\s?[,/]\s?(?:LEVEL)){2,}\b
        | \b(?:LEVEL)(?:\s?[,/]\s?(?:LEVEL))+,?\s(?:and|or|&|und|oder|et|ou|y|o|e|en|of)\s(?:LEVEL)\b
        | (?:is|are)\ confidential\ and\ (?:is\ |are\ )?intended\ (?:solely|only)\ for
        | may\ contain\ (?:confidential|privileged)(?:\ and(?:/or)?\ (?:confidential|privileged))?\ information
        | l\.a\.\ confidential
        | ASKED(?:\s?(?:,|、|と|和|与|及|과|와|및|و|och|jämfört\ med|vs\.?|versus|and|or|und|oder|et|ou|y|o|e|en|i|a|ve|или|и)\s?ASKED)+
        "#
        .replace("ASKED", ASKED)
        .replace("QUOTED", QUOTED)
        .replace("LEVEL", LEVEL),
    )
    .expect("allow phrases")
});

/// The text's confidentiality score (the sum of the weights found).
pub fn score(text: &str) -> f32 {
    // Taking the look-alike phrases out lowers the score (it could add a
    // word boundary, which only errs towards confidential): most texts
    // score 0 and are read once.
    let found = raw_score(text);
    if found == 0.0 || !NOT_CONFIDENTIAL.is_match(text) {
        return found;
    }
    raw_score(&NOT_CONFIDENTIAL.replace_all(text, " "))
}

/// `text` without the phrases that look confidential but are not (a
/// technology's name, a quoted marking, the e-mail disclaimer), for the
/// classifier: neither detector should count them.
pub fn without_look_alikes(text: &str) -> std::borrow::Cow<'_, str> {
    NOT_CONFIDENTIAL.replace_all(text, " ")
}

fn raw_score(text: &str) -> f32 {
    let lexicon = &*LEXICON;
    lexicon
        .terms
        .matches(text)
        .iter()
        .map(|i| lexicon.weights[i])
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markings_count_whole_and_topics_half() {
        assert!(score("CONFIDENTIAL: Q3 plan") >= 1.0);
        assert!(score("This is vertraulich.") >= 1.0);
        assert!(score("这份文件是机密") >= 1.0);
        // The markings learnt from the third development set, and the
        // words around them that are not markings.
        for marked in [
            "POUFNE: plan sprzedaży",
            "Konfidentiellt – endast för styrelsen",
            "Strikt vertrouwelijk: de cijfers",
            "대외비: 구조조정 계획",
            "GİZLİ – kurul kararı",
            "سري للغاية: الخطة",
            "गोपनीय: विलय",
            "Конфиденциально: отчёт",
        ] {
            assert!(score(marked) >= 1.0, "{marked}");
        }
        for plain in [
            "Jeg er fortrolig med Excel",
            "Accedi all'area riservata",
            "Profil gizli: evet",
            "политика конфиденциальности сайта",
            "정보보안의 기밀성",
            "Bonus kart ile 2.000 TL indirim",
            "गोपनीयता नीति",
        ] {
            assert!(score(plain) < 1.0, "{plain}");
        }
        // Learnt from the fourth development set: a warning before a
        // dismissal, a performance plan, a triage note, Arabic's heading.
        for marked in [
            "Le daremos una amonestación a Luis, el paso previo al despido.",
            "Mehmet'i performans iyileştirme planına aldık; olmazsa işine son verilecek.",
            "Pt stable overnight. Dx: pneumonia, hx of COPD.",
            "سري: تفاصيل العرض",
        ] {
            assert!(score(marked) >= 1.0, "{marked}: {}", score(marked));
        }
        assert_eq!(
            score(
                "This email and its attachments are confidential and intended solely for the recipient."
            ),
            0.0
        );
        assert_eq!(score("I was diagnosed last week"), 0.5);
        assert!(score("I was diagnosed with diabetes") >= 1.0);
        assert!(score("My salary is 90k and I got a bonus") >= 1.0);
        assert_eq!(score("What are the symptoms of flu?"), 0.0);
        assert_eq!(score("Explain confidential computing on AMD SEV."), 0.0);
    }

    /// Markings the look-alike phrases must leave alone (the lexicon
    /// alone: the classifier could hide a regression here), and the
    /// mentions they take out.
    #[test]
    fn markings_stay_markings_and_mentions_do_not_count() {
        for marked in [
            "「社外秘」来期の組織再編について",
            "\"سري للغاية\": خطة الاستحواذ",
            "Ce document est « confidentiel » : ne le transmettez à personne.",
            "Bitte „vertraulich“ behandeln: die Zahlen für Q3",
            "This memo is “Confidential”. The board will close the plant.",
            "Project Falcon board pack\n\"CONFIDENTIAL\"\nQ3 numbers",
            "本文件受保密协议约束。",
            "Internal, Confidential, Secretary's notes on the reorg",
            "PROTECTED BY ATTORNEY-CLIENT PRIVILEGE\nnotes from the call",
            "Treat as \"confidential\": the new product launches on 3 March.",
            "Handle as 'internal only': Leeds closes in May",
            "Le rapport est interne et « confidentiel » : le site ferme.",
            "Confidential AI roadmap for the board: drop vendor X.",
            "CONFIDENTIAL AIRBUS DEAL: terms attached",
            "Wir haben das in vertraulichem Rahmen besprochen.",
            "Anbei vertrauliche Unterlagen zum Umbau",
            // A label named and then applied; a client list marked.
            "\"Confidential\" label applied. Leeds closes in May.",
            "Confidential client list: the Hartmann account is leaving us.",
        ] {
            assert!(score(marked) >= 1.0, "{marked}: {}", score(marked));
        }
        for mentioned in [
            "「社外秘」と「極秘」の違いを教えてください。",
            "Vad betyder \"Hemlig\" jämfört med \"Konfidentiell\"?",
            "ما الفرق بين \"سري\" و\"سري للغاية\"؟",
            "Should I mark this newsletter as 'confidential'?",
            "Translate « confidentiel » for the glossary.",
            "Was bedeutet der Vermerk „vertraulich“ auf einem Brief?",
            "Is it 'secret' and 'confidential' or just one?",
            "Our labels are Public, Internal Only, Confidential and Restricted.",
            "员工离职后的保密义务持续多久？",
            "Qu'est-ce que l'informatique confidentielle ?",
            // Learnt from the eighth and ninth development sets.
            "How do I put a \"Confidential\" banner on every slide in Keynote?",
            "In OAuth, is a SPA a public client or a confidential client?",
        ] {
            assert_eq!(score(mentioned), 0.0, "{mentioned}");
        }
    }
}
