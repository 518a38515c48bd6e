use super::*;

fn detector() -> Detector {
    Detector::new(&Settings::default()).unwrap()
}

fn kinds(text: &str) -> Vec<&'static str> {
    detector().scan([text])
}

#[track_caller]
fn finds(kind: &str, texts: &[&str]) {
    for text in texts {
        assert!(
            kinds(text).contains(&kind),
            "{kind} not found in {text:?}: {:?}",
            kinds(text)
        );
    }
}

#[track_caller]
fn misses(kind: &str, texts: &[&str]) {
    for text in texts {
        assert!(
            !kinds(text).contains(&kind),
            "{kind} wrongly found in {text:?}"
        );
    }
}

#[test]
fn email() {
    finds(
        "email",
        &["write to jane.doe@example.com", "JANE@EXAMPLE.CO.UK"],
    );
    misses("email", &["the @ sign", "user@localhost"]);
}

#[test]
fn payment_card() {
    finds(
        "payment-card",
        &[
            "card 4111 1111 1111 1111",
            "4111.1111.1111.1111",
            "卡号４１１１１１１１１１１１１１１１",
            "4111\u{200B}1111 1111 1111",
        ],
    );
    misses(
        "payment-card",
        &["order 1234 5678 9012 3456", "1111 1111 1111 1111"],
    );
}

#[test]
fn iban() {
    finds(
        "iban",
        &[
            "IBAN DE89 3704 0044 0532 0130 00",
            "iban: gb82west12345698765432",
        ],
    );
    misses("iban", &["DE88 3704 0044 0532 0130 00"]);
}

#[test]
fn national_ids() {
    finds(
        "us-ssn",
        &["SSN 123-45-6789", "my social security number is 123456789"],
    );
    misses("us-ssn", &["call 666-45-6789", "id 123456789"]);
    finds("uk-nino", &["NI number AB 12 34 56 C", "ab123456c"]);
    misses("uk-nino", &["code GB123456A"]);
    finds(
        "nhs-number",
        &["NHS number 943 476 5919", "patient 9434765919"],
    );
    misses("nhs-number", &["invoice 943 476 5919"]);
    finds("cn-resident-id", &["身份证号11010519491231002X"]);
    misses("cn-resident-id", &["110105194912310021"]);
    let valid = aadhaar();
    finds("in-aadhaar", &[valid.as_str()]);
    finds(
        "eu-vat",
        &["our VAT number is DE123456789", "USt-IdNr. DE123456789"],
    );
    misses("eu-vat", &["part DE123456789 in stock"]);
    finds(
        "passport",
        &[
            "passport no. X1234567",
            "护照号码E12345678",
            "paspoortnummer NW1234567",
            "номер паспорта 751234567",
            "여권번호 M12345678",
        ],
    );
    misses("passport", &["ticket X1234567"]);
    finds(
        "bank-account",
        &[
            "sort code 12-34-56, account number 12345678",
            "계좌번호 110-123-456789",
            "口座番号 1234567",
            "CLABE 002010077777777771",
            "IFSC HDFC0001234, account no 50100123456789",
            "Konto 0532013000",
            // Grouped like a date, but no year: an account.
            "account number 1234-56-78",
        ],
    );
    misses(
        "bank-account",
        &[
            "account of 2023-24 results",
            "ticket 110-123-456789",
            "account opened 2023-10-05",
            "Konto seit 05-10-2023",
        ],
    );
}

/// A valid Aadhaar-shaped number: the one check digit that completes it.
fn aadhaar() -> String {
    (0..10)
        .map(|d| format!("Aadhaar 2345 6789 012{d}"))
        .find(|s| validate::verhoeff(s))
        .unwrap()
}

#[test]
fn phones() {
    finds(
        "phone",
        &[
            "call (555) 123-4567",
            "+44 20 7946 0958",
            "+49 30 901820",
            "手机13812345678",
            "Telefon: 030 901820",
            // National mobile formats, no phone word needed.
            "écrivez-moi au 06 12 34 56 78",
            "text 07700 900123 after six",
            "携帯は090-1234-5678です",
            // Phone words of more languages.
            "WhatsApp 98765 43210",
            "meu celular é 11 98765 4321",
            "전화 010-1234-5678",
            "телефон 8 912 345 67 89",
            "llámame al 91 123 45 67",
            "bel me op 020 123 4567",
            "Sie erreichen mich unter 089 1234 5678",
            "me chama no zap 11 98765 4321",
            // More national mobiles by their grouping alone.
            "Nachricht an 612 34 56 78 bitte",
            "mobil: 0172 3456 7890",
            "sms naar 06-12345678",
            "fala comigo (21) 98765-4321",
            "客户电话139 1234 5678",
            "delivery wale ko 98765 43210 pe",
            // "call" in any form, and a number that is no date.
            "Callback number: 020 7946 0018",
            "She called from 0113 496 0102 about the invoice",
            "Tel. 0711 12 34",
            "Tel. 2024 13 45",
        ],
    );
    misses(
        "phone",
        &[
            "version 2.14.3",
            "the year 2024",
            "order 0612345678 shipped",
            "invoice 07700900123",
            "ratio 06 12 34",
            // A phone word's look-alikes: "called", and a date.
            "the releases are called 2024.03.18 and 2024.05.2",
            "phone bill of 2024.03.18",
        ],
    );
}

#[test]
fn addresses_dates_and_network() {
    finds(
        "postal-address",
        &[
            "I live at 221B Baker Street",
            "London NW1 6XE",
            "Springfield, IL 62704",
            "Hauptstraße 5",
            "12 rue de la Paix",
            "北京市朝阳区建国路88号",
            "Via Roma, 12, Milano",
            "Rua Augusta, 100",
            "Kalverstraat 92, Amsterdam",
            "Drottninggatan 53",
            "〒100-0001 東京都千代田区",
            "千代田区千代田1丁目1",
            "서울특별시 강남구 테헤란로 123",
            "上海市徐汇区漕溪北路595弄3号",
            "P.O. Box 4471, Springfield",
            "Postbus 1234, Utrecht",
            "Postfach 10 20 30",
            "Flat No. 12, Sector 4",
            "मकान नं. 57, सेक्टर 9",
            "Ballyhaunis Road, Co. Galway H91 X2P7",
            "Terenure, Co Dublin D6W K2X8",
        ],
    );
    misses(
        "postal-address",
        &[
            "I have 3 cats",
            "Multiply 4821 by 3907 and then subtract the square of 97",
            "서울로 2명이 갑니다",
            "sent via email, 12 people replied",
            "the box 42 in row 7",
            "part H91 X2P7 is out of stock",
        ],
    );
    finds(
        "date-of-birth",
        &[
            "born on 4 July 1976",
            "DOB: 1976-07-04",
            "出生日期：1976年7月4日",
            "生年月日: 1976年7月4日",
            "생년월일 1976년 7월 4일",
            "nato il 4/7/1976",
            "data de nascimento: 04/07/1976",
            "дата рождения 4 июля 1976",
            "geboortedatum 04-07-1976",
            "doğum tarihi 04.07.1976",
        ],
    );
    misses("date-of-birth", &["the meeting on 1976-07-04"]);
    finds(
        "ip-address",
        &[
            "server at 192.168.1.20",
            "fe80::1ff:fe23:4567:890a",
            "the build server is 10.20.30.40",
            "build: 10.20.30.40",
        ],
    );
    misses(
        "ip-address",
        &[
            "version 1.2.3",
            "pi is 3.14159",
            "Firmware 2.4.1.7 fixes it",
            "upgrade to version: 1.0.0.12",
            "then upgrade to 3.2.1.2 from there",
            "see section 4.2.1.3 of the RFC",
            "§ 2.1.4.1 says so",
            "版本 2.4.1.7",
            // Networks, not hosts.
            "vpc_cidr = 10.0.0.0/16",
            "subnet 172.16.8.0/22",
        ],
    );
    finds(
        "ip-address",
        &[
            // A host inside a network is still one.
            "allow 10.0.3.17/32",
            "the host 10.1.2.3/16",
            // "updated to" may name a server.
            "The DB host IP was updated to 10.42.7.19 last night",
        ],
    );
    finds("mac-address", &["mac 00:1A:2B:3C:4D:5E"]);
}

#[test]
fn secrets() {
    finds(
        "api-key",
        &[
            "AKIA4H7Q2ZK9RT3WXP5N",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "glpat-abcdefghij0123456789",
            "xoxb-123456789012-abcdefghij",
            "sk_live_abcdefghijklmnop1234",
            "sk-proj-abcdefghijklmnopqrstuvwx",
            "sk-proj-abcdefghijklmnopqrstuvwx------",
            "sk-ant-api03-abcdefghijklmnopqrstuv",
            "AIzaSyA1234567890abcdefghijklmnopqrstuv",
            "SG.abcdefghijklmnop.abcdefghijklmnopqrstuvwx",
            "hf_abcdefghijklmnopqrstuvwxyz0123",
            "VAULT_TOKEN=hvs.CAESIJ1234567890abcdefghijklmnop",
            "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "bot 1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq",
            "key-0123456789abcdef0123456789abcdef",
            "gsk_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOP",
            "r8_abcdefghijklmnopqrstuvwxyz0123456789A",
        ],
    );
    misses(
        "api-key",
        &[
            "task-management",
            "sk-short",
            "a key-value store",
            "pypi-package",
            "at 12:30 AA flight",
            "r8_short",
            // Documentation examples and formats filled with one character.
            "AKIAIOSFODNN7EXAMPLE",
            "STRIPE_SECRET_KEY=sk_test_xxxxxxxxxxxxxxxxxxxxxxxx",
            "ghp_000000000000000000000000000000000000",
        ],
    );
    finds("private-key", &["-----BEGIN RSA PRIVATE KEY-----\nMIIE..."]);
    finds(
        "jwt",
        &[
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ],
    );
    finds(
        "password",
        &[
            "postgres://app:S3cr3t!pw@db:5432/prod",
            "password = \"hunter22\"",
            "Server=db;Pwd=Tr0ub4dor;",
            "my password is hunter2",
            "le mot de passe est Soleil42",
            "das Passwort lautet Sommer2024!",
            "Wifi password: is now Blue-Fox-19",
            "パスワードは abc123!",
            "пароль qwerty123",
        ],
    );
    misses(
        "password",
        &[
            "password: ****",
            "enter your password = <password>",
            "password_field_label",
            "the password is incorrect",
            "your password must be (at least 12 characters)",
            "a password reset link, valid 24 hours",
            "password123 is a weak example of a password",
            "the password was changed on 2024-01-05.",
            "I changed the password to something stronger",
            "set the password to expire after 90 days",
            // Names, URLs, dates and encodings on a password's line.
            "password_reset_url = \"https://example.com/reset\"",
            "password_changed_at: \"2024-01-05T10:00:00Z\"",
            "password = request.form['password'].encode('utf-8')",
            "Password: must be at least 12 characters",
            "Passwort: mindestens 8 Zeichen",
            "Password: 8-64 characters, no spaces",
            "password: !vault |",
            "pwd: /home/alice/projects",
            "The password is case-sensitive, right?",
            "what does 'password: hidden' mean?",
            // Words, and code that reads a password from somewhere.
            "Password: printed on the label",
            "the password for the admin account is printed on the label",
            "db_password = os.environ[\"DB_PASSWORD\"]",
            "password = models.CharField(max_length=128)",
            "PASSWORD = getenv(\"PW\")",
            "const password = process.env.DB_PASSWORD;",
        ],
    );
    finds(
        "password",
        &[
            "password: sunshine",
            "Password: sunshine\nUser: bob",
            "password: hunter2 please change it",
            "my passphrase is correct-horse-battery-staple",
            "mysql --password=secretpw -h db",
            "DB_PASSWORD=Sunshine # prod",
            "user: admin password: swordfish host: db1",
            "password: letmein (temporary)",
            "password: !QAZ2wsx",
            "password: Abc(123",
            // Lower-case passwords and passphrases with words after them.
            "password: correct horse battery staple",
            "Login admin, password: dragon for the staging box",
            // A literal on the line of code that reads a password.
            "DB_PASSWORD = os.getenv(\"DB_PASSWORD\", \"Pr0d-S3cret!\")",
            "const password = process.env.DB_PASSWORD || 'Winter2024!';",
            "password = base64.b64decode(\"UHIwZC1TM2NyZXQh\").decode()",
            "password = hashlib.sha256(b\"hunter2\").hexdigest()",
            "I changed the password to Tulip#2024 yesterday",
            "reset my password to Spring-77!",
            "Change the password to Tulip#2024",
            "We reset all user passwords to Welcome2024!",
            "changed the admin account password to Otter#99",
            "changed the password for the router to Tiger#4412",
            // Any literal on the line, weak defaults, a symbol first.
            "conn = psycopg2.connect(password=os.getenv(\"PGPASSWORD\", \"Winter2024!\"), host=\"dbhost\")",
            "DB_PASSWORD = os.getenv(\"DB_PASSWORD\", \"Password123\")",
            "password = os.getenv(\"PW\", \"!QAZ2wsx\")",
            "const password = process.env.PW ?? `Monkey123`;",
            // A capitalised word after a where-word is a password.
            "password: Under Pressure",
            // What it is for, between the word and the value.
            "the password for the router is Tiger#4412",
            "la password del wifi di casa è Girasole_77",
            "het wachtwoord van de gedeelde mailbox is Fiets!88",
            "वाई-फाई का पासवर्ड: Chai@Home12",
        ],
    );
    finds(
        "secret",
        &[
            "client_secret = \"9fK2mQ7xL1pZ8rT4vB6nW3yH\"",
            "SMTP_PASS=Zq8vN2kLp4Rt7WxY",
            "ENCRYPTION_KEY: 3fA9kQ2mZ7xL1pR8tV4bN6wY",
            "curl -H 'Authorization: Bearer 8f3aK29dLq0ZpX7mN4vR2tY6'",
            "Authorization: Basic dXNlcjpwYXNzd29yZA==",
        ],
    );
    misses(
        "secret",
        &[
            "token_count = 1234567890123456",
            "primary_key = user_id_and_timestamp",
            "use a bearer token in the Authorization header",
        ],
    );
}

#[test]
fn confidential_prose() {
    finds(
        CONFIDENTIAL,
        &[
            "CONFIDENTIAL - do not forward",
            "My salary is 90k and my bonus was cut",
        ],
    );
    misses(
        CONFIDENTIAL,
        &[
            "What are the symptoms of flu?",
            "Explain confidential computing.",
            "Should I mark this newsletter as 'confidential'?",
            "Translate « confidentiel » for the glossary.",
            "the difference between confidential, secret and top secret",
            "Who directed L.A. Confidential?",
            "This email may contain confidential information.",
            // Technology names, a mention after a word, a scheme of
            // levels, the duty of confidentiality, the doctrine's name.
            "Qu'est-ce que l'informatique confidentielle ?",
            "¿Qué es la computación confidencial?",
            "Was bedeutet der Vermerk „vertraulich“ auf einem Brief?",
            "Our labels are Public, Internal Only, Confidential and Restricted.",
            "员工离职后的保密义务持续多久？",
            "Explain attorney-client privilege to a student.",
        ],
    );
    finds(
        CONFIDENTIAL,
        &[
            "Confidential: the board approved the merger.",
            "Keep this confidential until Friday.",
            "'CONFIDENTIAL' Q3 plan attached: do not forward",
            r#"{"classification": "confidential", "topic": "Q3"}"#,
            "\"Confidential\" - Q3 minutes",
            "Confidential and restricted: the merger terms",
            "INTERNAL, CONFIDENTIAL",
            "Gehaltsliste: Anna 62.000 €, Tom 58.500 €",
            "This memo is attorney-client privileged.",
            "请对这份文件保密",
            // Markings quoted as markings rather than mentioned: held to
            // the lexicon's own score in prose::lexicon's tests.
        ],
    );
}

#[test]
fn a_value_split_across_messages_is_found_joined() {
    let d = detector();
    assert!(
        d.scan(["my card is 4111 1111", "1111 1111 thanks"])
            .contains(&"payment-card")
    );
    assert!(d.scan(["my card is 4111 1111"]).is_empty());
    // Words between the parts, and another number before them.
    assert!(
        d.scan([
            "order 77, card starts 4111 1111",
            "ok",
            "and ends 1111 1111"
        ])
        .contains(&"payment-card")
    );
    assert!(d.scan(["I have 12 cats", "and 34 dogs"]).is_empty());
}

#[test]
fn operator_patterns_and_allow_lists() {
    let patterns = [Pattern {
        kind: "employee-id".into(),
        regex: r"\bEMP-\d{6}\b".into(),
    }];
    let allow = [r"4111 1111 1111 1111".to_string()];
    let settings = Settings {
        patterns: &patterns,
        allow: &allow,
        ..Settings::default()
    };
    let d = Detector::new(&settings).unwrap();
    assert_eq!(d.scan(["ticket for EMP-123456"]), vec!["employee-id"]);
    // The public test card is allowed; another valid card is not.
    assert!(d.scan(["test card 4111 1111 1111 1111"]).is_empty());
    assert_eq!(d.scan(["card 5555 5555 5555 4444"]), vec!["payment-card"]);
    // The same through `with`, on a detector already built.
    let added = detector().with(&settings).unwrap();
    assert_eq!(added.scan(["ticket for EMP-123456"]), vec!["employee-id"]);
    assert!(added.scan(["test card 4111 1111 1111 1111"]).is_empty());
    assert!(detector().scan(["ticket for EMP-123456"]).is_empty());
    let bad = ["(".to_string()];
    let bad = Settings {
        allow: &bad,
        ..Settings::default()
    };
    assert!(Detector::new(&bad).is_err());
}

/// The built-in rules scored on a set shipped in `tests/detection/`.
fn evaluate_shipped(file: &str) -> eval::Report {
    let path = format!(
        "{}/../../tests/detection/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    eval::evaluate(&detector(), &text).unwrap()
}

/// The shipped evaluation set (`tests/detection/`), held to the issue's
/// bars: recall ≥ 0.97 for identifiers and secrets, ≥ 0.80 for
/// confidential prose, ≤ 5 % false positives on clean prompts. The rules
/// were written against this set, so the numbers are a regression guard,
/// not an unbiased estimate (README).
#[test]
fn the_evaluation_set_meets_its_bars() {
    let report = evaluate_shipped("eval.jsonl");
    assert!(report.sensitive > 300 && report.clean > 100, "{report:?}");
    let (mut n, mut found) = (0, 0);
    for (kind, (k, f)) in &report.by_kind {
        if kind != CONFIDENTIAL {
            n += k;
            found += f;
        }
    }
    assert!(
        found as f64 / n as f64 >= 0.97,
        "identifiers and secrets: {found}/{n}: {report:?}"
    );
    let (k, f) = report.by_kind[CONFIDENTIAL];
    assert!(
        f as f64 / k as f64 >= 0.80,
        "confidential {f}/{k}: {report:?}"
    );
    assert!(report.false_positive_rate() <= 0.05, "{report:?}");
}

/// Prompts about passwords, confidentiality markings, versions, keys and
/// accounts that hold none of them (`tests/detection/topics.jsonl`,
/// written by hand; 17 of its 36 clean prompts were flagged before the
/// rules learnt to read them), and a few that do.
#[test]
fn topics_are_not_secrets() {
    let report = evaluate_shipped("topics.jsonl");
    assert!(report.clean >= 36 && report.sensitive >= 8, "{report:?}");
    assert!(report.false_positive_rate() <= 0.05, "{report:?}");
    for (kind, (n, found)) in &report.by_kind {
        assert_eq!(found, n, "{kind}: {report:?}");
    }
}

#[test]
fn a_megabyte_of_digits_is_scanned_without_blowing_up() {
    // Every candidate fails its checksum: the retry-after-failure loop
    // must still move forward (this would hang if it did not).
    let digits = "1234567890 ".repeat(100_000);
    let found = detector().scan([digits.as_str()]);
    assert!(!found.contains(&"payment-card"), "{found:?}");
}

#[test]
fn review_findings_stay_fixed() {
    // Latin text right after CJK characters (no Unicode word boundary).
    finds(
        "email",
        &["我的邮箱是jane@example.com", "メールはjane@example.comです"],
    );
    finds("api-key", &["密钥是sk-proj-abcdefghijklmnopqrstuvwx"]);
    // A card followed by its expiry date or CVV.
    finds(
        "payment-card",
        &["card 4111 1111 1111 1111 12/25", "4111-1111-1111-1111-01"],
    );
    // Digits of other scripts, bidi isolates and non-ASCII dashes.
    finds(
        "payment-card",
        &[
            "٤١١١ ١١١١ ١١١١ ١١١١",
            "4111\u{2066}1111 1111 1111",
            "4111\u{2011}1111\u{2011}1111\u{2011}1111",
        ],
    );
    // Postcode shapes with non-ASCII digits must not panic.
    let _ = kinds("NW1 ٦XE and A१ १AA");
}

#[test]
fn look_alikes_that_fail_their_checks_cannot_make_a_scan_quadratic() {
    // Each candidate runs to a bounded length, and after MAX_CANDIDATES
    // failures a rule counts as found (fail closed), so these finish.
    let d = detector();
    let placeholders = "password=$".repeat(100_000);
    assert!(d.scan([placeholders.as_str()]).contains(&"password"));
    let tokens = "token=token=".repeat(50_000);
    let _ = d.scan([tokens.as_str()]);
}

/// What a text must hold for a rule to match (its digits, its context
/// words: `must_hold`) is a necessary condition on every prompt shipped:
/// no rule that matches a text is skipped for it. And it skips something:
/// most rules are numbers or need context words.
#[test]
fn no_rule_that_matches_a_text_is_skipped_for_it() {
    let detector = detector();
    let numbers = detector.rules.iter().filter(|r| r.min_digits > 0).count();
    let with_words = detector.rules.iter().filter(|r| r.context_anywhere).count();
    assert!(
        numbers >= 25 && with_words >= 6,
        "{numbers}, {with_words} of {}",
        detector.rules.len()
    );
    let mut checked = 0;
    for file in [
        "eval.jsonl",
        "dev.jsonl",
        "dev2.jsonl",
        "dev3.jsonl",
        "dev4.jsonl",
        "dev5.jsonl",
        "dev6.jsonl",
        "dev7.jsonl",
        "dev8.jsonl",
        "dev9.jsonl",
        "heldout.jsonl",
        "heldout2.jsonl",
        "heldout3.jsonl",
        "heldout4.jsonl",
        "topics.jsonl",
    ] {
        let path = format!(
            "{}/../../tests/detection/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let labelled: serde_json::Value = serde_json::from_str(line).unwrap();
            for message in labelled["messages"].as_array().unwrap() {
                let prepared = normalize(message["content"].as_str().unwrap_or_default());
                let digits = crate::must_hold::count(&prepared);
                for rule in detector
                    .rules
                    .iter()
                    .filter(|r| r.pattern.is_match(&prepared))
                {
                    assert!(
                        digits >= rule.min_digits,
                        "{} (floor {}) matches {prepared:?} with {digits} digits",
                        rule.kind,
                        rule.min_digits
                    );
                    // Each match by itself, not only the whole text: a
                    // floor too high could hide under a text's other digits.
                    for found in rule.pattern.find_iter(&prepared) {
                        let held = crate::must_hold::count(found.as_str());
                        assert!(
                            held >= rule.min_digits,
                            "{} (floor {}) matched {:?}",
                            rule.kind,
                            rule.min_digits,
                            found.as_str()
                        );
                    }
                    if rule.context_anywhere && matches(rule, &prepared) {
                        let words = rule.context.as_ref().unwrap();
                        assert!(words.is_match(&prepared), "{}: {prepared:?}", rule.kind);
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 500, "only {checked} matches checked");
}

/// A text of thousands of look-alike numbers and no context words: the
/// rules that need the words are not searched, so their candidate cap
/// (which reports a kind it gave up checking) no longer reports them; a
/// rule that needs no words still fails closed at its cap.
#[test]
fn look_alikes_without_their_words_are_not_reported_by_the_cap() {
    let detector = detector();
    let rule = detector
        .rules
        .iter()
        .find(|r| r.kind == "nhs-number")
        .expect("the NHS number rule");
    assert!(rule.context_anywhere);
    // Ten digits each, every one failing the mod-11 check ("0000000001").
    let numbers = "order 0000000001 shipped; ".repeat(5000);
    assert!(
        matches(rule, &numbers),
        "without the skip, the cap reports it"
    );
    let found = detector.scan([numbers.as_str()]);
    assert!(!found.contains(&"nhs-number"), "{found:?}");
    let named = format!("NHS patient list: {numbers}");
    assert!(detector.scan([named.as_str()]).contains(&"nhs-number"));
}

/// What a third independent writer's development set (dev2.jsonl) showed
/// missing or wrongly found; the texts here are new, in the same shapes.
#[test]
fn more_languages_and_shapes_from_the_third_development_set() {
    finds(
        "password",
        &[
            "dane logowania: login anna_k, hasło: Jesien2020!",
            "kullanıcı adı: depo1, şifre: Masa5678!",
            "användarnamn kassa, lösenord: Björk#2211",
            "brukernavn: post, passord: Fjell77!",
            "curl -u builder:Qz!81buildXy https://repo.example.net/upload",
            "wget --http-user ops:Tr4in-Yard9 https://files.example.net/a",
        ],
    );
    misses(
        "password",
        &[
            "password = var.db_password",
            "password: settings.DB_PASSWORD",
            "Usuario: ____________\nContraseña: ____________",
            "Review my password hashing: use bcrypt with 12 rounds",
            "curl -u $USER:$TOKEN https://repo.example.net/",
        ],
    );
    // What a review of those rules found they must still find, and must
    // not take for a password.
    finds(
        "password",
        &[
            "Passwort WLAN: Sonnenblume7",
            "my wifi password is this.is.Sparta",
            "curl -u admin:P@ssw0rd https://repo.example.net/",
            "**Password:** Hunter2!",
            "WiFi şifre Masa5678!",
        ],
    );
    misses(
        "password",
        &[
            "docker run -u 1000:1000 alpine id",
            "docker run --user www-data:www-data nginx",
            "rsync -u backup:/srv/data ./data",
            "Parola: gatto",
            "Password policy: rotate every 90 days",
        ],
    );
    finds(
        "phone",
        &["문자 주세요: 010-3141-5926", "Arayın: 0544 271 82 81"],
    );
    finds(
        "postal-address",
        &[
            "Absender:\nKlaus Brandt\nIm Winkel 7b\n70173 Stuttgart",
            "adres: ul. Piotrkowska 212 m. 5, 90-001 Łódź",
            "Adres: Bağdat Cad. No:140 D:3, Kadıköy",
            "العنوان: 4410 شارع التحلية، حي السليمانية، الرياض 12245",
            "Address: Flat 12, Green Park, Sector 9, Vashi, Navi Mumbai 400703",
        ],
    );
    misses(
        "postal-address",
        &[
            "Chapter 3, 12345 words in all",
            "We sold 7, 10000 Units shipped last year",
            "Gründungsjahr 1998\n12000 Mitarbeiter",
            "الدفع عن طريق التحويل بمبلغ 15000 ريال",
            "flat 15% commission above 100000",
            "CAD No: 4471",
        ],
    );
    finds(
        "confidential",
        &[
            "POUFNE: zarząd rozważa sprzedaż spółki.",
            "Konfidentiellt – endast för ledningsgruppen.",
            "Strikt vertrouwelijk: de overname wordt volgende week bekend.",
            "대외비: 내년 구조조정 계획입니다.",
            "GİZLİ – yönetim kurulu kararı ektedir.",
            "سري للغاية: خطة الاستحواذ على الشركة",
            "गोपनीय: बोर्ड ने विलय को मंज़ूरी दी।",
            "Min lön höjs till 42 000 kr i månaden från januari.",
            "Mijn collega heeft een burn-out; de bedrijfsarts wil een plan.",
        ],
    );
    misses(
        "confidential",
        &[
            "Är det här företaget lönsamt?",
            "Incognito modu gizli sekme açar mı?",
            "गोपनीयता नीति में क्या लिखा जाता है?",
        ],
    );
}

/// Shapes learnt from the fourth independent development set
/// (tests/detection/DEV3.md): dates of birth in more languages and said
/// after the date, phones by their national shapes, lower-case and
/// two-word streets, passwords said with the word's definite form, on
/// command lines and in a Wi-Fi code, secrets given to flags, a
/// passport's machine-readable zone, and values typed across an
/// assistant's turn. New texts in the same shapes, not the set's own.
#[test]
fn identifiers_as_people_paste_them_from_the_fourth_development_set() {
    finds(
        "date-of-birth",
        &[
            "Resumen: Laila Haddad, من مواليد 5 أبريل 1988 في عمّان",
            "verified caller, D.O.B. 21-Oct-1979, card ending 0042",
            "Marta Kowalczyk · b. 17.06.1991 · Warsaw",
            "Doğum tarihi: 19 Ağustos 1985, İzmir",
            "जन्मतिथि 14 अगस्त 1990 है",
            "Niño: Pablo Ortega. F. nac.: 02/11/2015",
            "저는 1988년 7월 21일생입니다.",
            "書類には「平成2年5月9日生」とあります",
            "she was born on the 9th of June 1972 in Galway",
            "Jan Dvořák, datum narození: 3. 9. 1979",
            "Wnioskodawca Piotr Nowak, ur. 22.08.1990 w Gdańsku",
        ],
    );
    misses(
        "date-of-birth",
        &[
            "Meeting notes a. 12.03.2024 b. 19.03.2024",
            "The seminar. 12.03.2024 at ten",
            "Invoice dated 4 March 2024, due in 30 days",
        ],
    );
    finds(
        "passport",
        &[
            "P<DEUMUSTERMANN<<ERIKA<<<<<<<<<<<<<<<<<<<<<<\nC01X00T478D<<8503161M3001019<<<<<<<<<<<<<<04",
        ],
    );
    finds(
        "date-of-birth",
        &["C01X00T478D<<8503161M3001019<<<<<<<<<<<<<<04"],
    );
    // One check digit wrong: a line of the same shape, not a passport's.
    misses(
        "passport",
        &["C01X00T479D<<8503161M3001019<<<<<<<<<<<<<<04"],
    );
    finds(
        "phone",
        &[
            "Cabinet du Dr Martin, tél. 02.98.41.77.30",
            "كلمني على الواتس 0112 345 6789",
            "官方热线 010-5873 2200 转 12",
            "Text Sam on 0412 345 678 after six",
            "Kargo için 0 (542) 318 77 41 numarasını arayın",
            "Bitte anrufen: 030 901820",
        ],
    );
    misses(
        "phone",
        &[
            "Meine Bestellung Nr. 4090909681 ist unvollständig",
            "Herinnering: factuur 2025-7731 staat nog open",
            "Excellent quarter: 1234 5678 units shipped",
        ],
    );
    finds(
        "postal-address",
        &[
            "Grote Markt 7 bus 2\n8000 Brugge",
            "ship to: 77 e grand ave suite 400 chicago il 60611",
            "unit 3/42 beach rd bondi nsw 2026",
            "Lieferadresse: Leipziger Str. 41, 10117 Berlin",
            "ADR;TYPE=WORK:;;Hauptplatz 3;Graz;;8010;Austria",
            "Bennelong Point, Sydney NSW 2000",
        ],
    );
    misses(
        "postal-address",
        &[
            "took 2 steps out of the way in 2021",
            "Data Protection ACT 2018 applies",
        ],
    );
    finds("iban", &["Rekening (afgebroken):\nNL44RABO01\n23456789"]);
    finds(
        "password",
        &[
            "Wi-Fi adı Ev_5G, şifresi Limon.2025!",
            "Účet: sklad@firma, heslo je Modra-Ryba-17.",
            "Login masz, a hasło to Kaczka_Gdynia9.",
            "Larmet: lösenordet är Sill&Potatis42",
            "यूज़रनेम admin और पासवर्ड है Neem@2025",
            "اسم المستخدم a.karim وكلمة المرور هي Zaytoun#2025",
            "mysql -h db -u app -p'Qx!7731ab' shop",
            "sshpass -p 'Tr33-House!' ssh deploy@10.0.0.5",
            "WIFI:T:WPA;S:Office_Guest;P:latte-art-88;;",
            "kubectl get secret db -o jsonpath='{.data.password}' | base64 -d\nPg5-Main-71xq",
            "DB_PASSWORD=${DB_PASSWORD:-Pr0d-S3cret!}",
        ],
    );
    misses(
        "password",
        &[
            "DB_PASSWORD=${DB_PASSWORD:-请替换}",
            "log: `login ok user=jm password=********`. Is it masked?",
            "mysql -u root -p shop",
            "mysql -u app -p$MYSQL_PWD shop",
            "WIFI:T:WPA;S:Office;P:<password>;;",
        ],
    );
    finds(
        "api-key",
        &[r#"{"client_secret": "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"}"#],
    );
    finds(
        "secret",
        &[
            "RUN some-cli login --token Zk82hQx7Lp0Vw3Ty9Rb5Nc1M && make",
            r#"<meta-data android:name="com.example.MAPS_KEY" android:value="Qm8xV2kL9pR4tZ7wN3cY6bH1" />"#,
        ],
    );
    misses(
        "secret",
        &["./run --token-file /etc/app/token.txt --verbose"],
    );
    // Typed across the assistant's turn.
    let d = detector();
    let across = |texts: [&str; 3]| d.scan(texts);
    assert!(
        across([
            "Save my brother's number: 07700",
            "Sure, the rest?",
            "900 461 please"
        ])
        .contains(&"phone")
    );
    assert!(
        across([
            "For the age check: I was born 3 February",
            "Which year?",
            "1981, is that enough?"
        ])
        .contains(&"date-of-birth")
    );
    assert!(
        across([
            "my IBAN in two parts: DE44 5001 0517",
            "Go on.",
            "5407 3249 31"
        ])
        .contains(&"iban")
    );
    // The context in one part, the whole value in the other.
    assert!(
        across([
            "For the form, my date of birth is",
            "Go ahead.",
            "14.03.1978"
        ])
        .contains(&"date-of-birth")
    );
    assert!(across(["I have 3 cats", "Nice!", "and 2 dogs born in 2019"]).is_empty());
}

/// Shapes learnt from the fifth independent development set
/// (tests/detection/DEV4.md): numbers a PDF's or a scan's copy broke over
/// lines, labels glued to a MAC address, a certificate's fingerprint that
/// holds MAC- and IPv6-shaped runs, and a secret's name with nothing after
/// it on its line.
#[test]
fn identifiers_broken_by_copies_from_the_fifth_development_set() {
    finds("cn-resident-id", &["身份证号码：1101051949\n1231002X"]);
    finds("in-aadhaar", &["Aadhaar No. :\n2345\n6789\n0124"]);
    finds("payment-card", &["Kartennum-\nmer 4111 1111\n1111 1111"]);
    finds("us-ssn", &["a Employee's SSN\n772-40-\n5617"]);
    finds("postal-address", &["wohnhaft in der Gneisenau-\nstraße 41"]);
    // Joined only where a card is named: a column of years is no card.
    misses("payment-card", &["Jahre:\n2019\n2020\n2021\n2012"]);
    finds(
        "mac-address",
        &[
            "MAC-Adresse:e6:63:aa:0c:ce:8f",
            "MAC地址：3E-F6-2F-04-C0-EE，连接",
            "show mac address-table: 3e4e.6bcc.ae8a Gi1/0/3",
        ],
    );
    misses(
        "mac-address",
        &["SHA-1 D0:2F:84:0E:92:7B:22:C8:25:78:5A:AD:EA:48:C3:09:A2:12:A7:DF"],
    );
    misses(
        "ip-address",
        &["SHA-1 D0:2F:84:0E:92:7B:22:C8:25:78:5A:AD:EA:48:C3:09:A2:12:A7:DF"],
    );
    finds("ip-address", &["IPv6:2001:db8:0:0:8:800:200c:417a"]);
    misses(
        "secret",
        &["STRIPE_SECRET_KEY=\nSESSION_SECRET=change-me-later-please"],
    );
    finds("passport", &["旅券番号：TR1234567、国籍：日本"]);
    finds(
        "postal-address",
        &["Адрес: г. Казань, ул. Баумана, д. 7, кв. 3"],
    );
    finds("phone", &["名刺：TEL 06・6543・2109 内線12"]);
    finds("bank-account", &["开户行：工商银行，账号：6222 0210 0112"]);
    // Typed across the assistant's turn: numbers the conversation names,
    // and tokens cut in two.
    let d = detector();
    let across = |texts: [&str; 3]| d.scan(texts);
    assert!(
        across([
            "my social security number starts 512-44",
            "ok",
            "and ends 7810"
        ])
        .contains(&"us-ssn")
    );
    assert!(
        across(["身份证前面是110105194", "好的", "后面是91231002X"]).contains(&"cn-resident-id")
    );
    assert!(
        across([
            "my key got cut: ghp_aB3dE5fG7hJ9kL1mN3pQ",
            "Paste the rest.",
            "R5sT7uV9wX1yZ3aB5cD7 thanks"
        ])
        .contains(&"api-key")
    );
    assert!(
        across([
            "my address is lena.fischer.k",
            "Go on.",
            "@example.org please"
        ])
        .contains(&"email")
    );
    assert!(across(["I have 3 cats", "ok", "@home 24 hours a day"]).is_empty());
    assert!(across(["order 512-44", "ok", "shipped 7810 units"]).is_empty());
}

/// What a review of the rules learnt from the fourth and fifth
/// development sets found they lost or took wrongly.
#[test]
fn review_of_the_fourth_and_fifth_sets_rules() {
    finds(
        "phone",
        &[
            "代表TEL:03-1234-5678",
            "Teléf.: 91 123 45 67",
            "tel_no: 030 1234567",
            "Ring mig på 070 123 45 67",
        ],
    );
    finds(
        "mac-address",
        &["MAC:3c:22:fb:7a:10:9e", "Client MAC:AA-BB-CC-DD-EE-FF"],
    );
    finds(
        "ip-address",
        &["Interface:2001:0db8:85a3:0000:0000:8a2e:0370:7334"],
    );
    finds("password", &["password: -Kp}7#zQ"]);
    finds(
        "secret",
        &[
            "Here's my access token:\n  EAAGm0PX4ZCpsBA1b2c3dE",
            "client_secret:\n  9f8e7d6c5B4a39281706f5e4",
            "BOT_TOKEN = \"7012345678:AAHx9kPq2LmZ7vR4tY8wB3nC6dF1gJ5sK0e\"",
        ],
    );
    finds(
        "payment-card",
        &["Card number\n4111 1111\n1111 1111\n09/27"],
    );
    misses(
        "payment-card",
        &["It is advisable to list:\n2019\n2020\n2021\n2012"],
    );
    misses(
        "date-of-birth",
        &[
            "people born between 1981 and 1996",
            "birth rates in 2019 and 2020",
            "births per 1000 women 2019",
        ],
    );
    misses(
        "postal-address",
        &[
            "I walked 2 km down the road in 2020",
            "3 nights at the place in 2019",
        ],
    );
}

/// Shapes learnt from the sixth independent development set
/// (tests/detection/DEV5.md): accounts, phones, addresses, VAT numbers
/// and e-mails as they vary by country. New texts in the same shapes.
#[test]
fn country_shapes_from_the_sixth_development_set() {
    finds(
        "bank-account",
        &[
            "يرجى التحويل إلى رقم الحساب 5512093384410",
            "Banco Itaú, agência 0412-3, conta corrente 55231-9",
            "nr rachunku: 61 1090 1014 0000 0712 1981 2874",
            "Pošlete na číslo účtu 19-2000145399/0800, prosím",
        ],
    );
    // A branch code alone names a bank's branch, not an account.
    misses("bank-account", &["Is IFSC HDFC0000123 the Andheri branch?"]);
    // What a review of those rules found.
    finds(
        "bank-account",
        &[
            "Transfer to 50100123456789, IFSC HDFC0001234",
            "IFSC HDFC0001234 account: 50100123456789",
        ],
    );
    misses(
        "bank-account",
        &["rachunek za 03/2025", "účet za 12/2026, díky"],
    );
    misses("postal-address", &["I code in C/Python 3 mostly"]);
    finds(
        "secret",
        &[
            "SECRET_KEY=dGhpc2lzYXNlY3JldGtleQ==",
            "client_secret:\n  dGhpc2lzYXNlY3JldGtleQ==",
            "FERNET_KEY=cw_0x689RpI-jtRR7oE8h_eQsKImvJapLeSbXpwF4e4=",
            "api_token: admin:Zk8Qv3LmP9xR2tW7",
        ],
    );
    finds(
        "postal-address",
        &["〒253-0000 茅ヶ崎市元町1-2", "〒150-0043、東京都渋谷区"],
    );
    finds("email", &["пишите на иван@mail.ru", "王伟@example.cn"]);
    // A phone typed in two parts with words before the second; a list
    // written with middle dots is no phone.
    let d = detector();
    for parts in [
        [
            "电话号码前半是 0755-8612",
            "好的，请继续。",
            "后半是 3347，帮我写短信。",
        ],
        [
            "Apunta mi fijo: 93",
            "Vale, ¿y el resto?",
            "418 22 67, gracias.",
        ],
    ] {
        assert!(d.scan(parts).contains(&"phone"), "{parts:?}");
    }
    assert!(
        !d.scan([
            "My phone is an iPhone 15",
            "Nice.",
            "It cost 999 dollars in 2023"
        ])
        .contains(&"phone")
    );
    misses("phone", &["携帯番号は090・080・070で始まりますか？"]);
    // From the seventh development set (DEV6.md): what a password is
    // for, in Swedish and Polish, a Hindi "है" after the English word, a
    // Hindi flat number without नं.
    finds(
        "password",
        &[
            "lösenordet till routern är Björk-2290",
            "hasło do routera: Sowa_Leśna71",
            "मेरा password है Laddu#2290, याद रखना",
        ],
    );
    misses("password", &["lösenordet till wifi är svårt att minnas"]);
    finds("postal-address", &["मेरा पता: फ्लैट 17, गंगा निवास, पुणे 411002"]);
    finds(
        "eu-vat",
        &[
            "UID-Nr. ATU12345678 bitte eintragen",
            "NIP PL5260250274 na fakturze",
            "their vat no: de136695976, reverse charge?",
        ],
    );
    misses(
        "eu-vat",
        &["VAT rules for 2026: is DE a reverse-charge country?"],
    );
    finds(
        "eu-vat",
        &["Bitte prüfe die Umsatzsteuer-ID DE136695976 gültig ist."],
    );
    finds(
        "phone",
        &[
            "O meu telemóvel é 913 224 681, obrigado",
            "Appelez le +33 (0)4 78 00 12 34 demain",
        ],
    );
    finds(
        "postal-address",
        &[
            "Mándalo a C/ Alcalá 120, 3º dcha., 28009 Madrid",
            "Adresa: Korunní 810/104, 101 00 Praha",
            "पता: फ्लैट नं. 12, शांति निवास, पुणे 411001",
            "〒150-0043 渋谷区道玄坂1-2-3",
            "Address: 4 Oak Lawn, Rathgar, Dublin 6, D06 F6K2",
        ],
    );
    misses("postal-address", &["〒150-0043 はどこの地域ですか？"]);
    finds("cn-resident-id", &["公民身份号码 1101 0519 4912 3100 2X"]);
    finds(
        "email",
        &[
            "Mail an jürgen.weiß@post.example.com",
            "contact@café.example.org",
        ],
    );
}

#[test]
fn shapes_from_the_eighth_and_ninth_development_sets() {
    // Passwords said with an abbreviation, what they are for, a
    // relative clause, the language's "is" (c'est, to), a Russian or
    // Arabic preposition; a Redis config's requirepass.
    finds(
        "password",
        &[
            "The password we picked was Lantern-Oak-77, write it down",
            "le mdp de la box c'est Hibou-Gris-31",
            "la clave de la red es Pinar_4410, no la compartas",
            "our pw is Maple7731 now",
            "пароль для почты: Lipa_2023!",
            "كلمة المرور لحساب البنك: Sahra#88_q",
            "hasło do laptopa w domu to Lis#Mak2024",
            "requirepass 9fKq2LmZx7Tb\nport 6379",
        ],
    );
    misses(
        "password",
        &[
            "la clave del éxito es trabajar",
            "le mdp c'est pas sécurisé ?",
            // A form's hint, and a masked value in non-ASCII quotes.
            "パスワード：半角英数字8文字以上で入力してください",
            "密码：请输入6-16位字符",
            "Il campo mostra «Password: ******» e basta",
        ],
    );
    // A password typed on across the assistant's turn, with its hyphen
    // or without.
    let d = detector();
    for parts in [
        [
            "The wifi password is Walnut",
            "Go on.",
            "-Kettle-22, thanks",
        ],
        [
            "my password is Copper",
            "And the rest?",
            "Fox91 is the rest",
        ],
    ] {
        assert!(d.scan(parts).contains(&"password"), "{parts:?}");
    }
    // Secrets in Go's `:=` and in a YAML list; a record's key and AWS's
    // documented example are none.
    finds(
        "secret",
        &[
            "secretKey := \"Qm9xJ3kLp7Zr2TnW8vXc\"",
            "params:\n  api_token: ['Hq7LzP2wXk9RtV4nB8mC']",
        ],
    );
    misses(
        "secret",
        &[
            "cache_key=0f3c9a7e-5b1d-4e2a-9c8f-6d4b2a1e7f90 hit=true",
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        ],
    );
    // Belgian mobiles and GSM; a reference number is no phone.
    finds(
        "phone",
        &["GSM: 0471 22 93 58", "stuur het naar 0487 12 34 56 aub"],
    );
    misses(
        "phone",
        &[
            "Quote reference 999 244 9791 on the appeal form",
            "order #555-201-0042 shipped",
        ],
    );
    // A Chinese road and number with spaces, a Spanish "C/ de …".
    finds(
        "postal-address",
        &[
            "地址：北京市朝阳区建国路 88 号",
            "envíalo a C/ del Carmen 14, 1º A, 28013 Madrid",
        ],
    );
    // Born at a place, then the date.
    finds(
        "date-of-birth",
        &[
            "nata a Lecce il 03/11/1984",
            "né à Rennes le 14/02/1979",
            "nacida en Cádiz el 2 de mayo de 1990",
        ],
    );
}

/// What a review (helper) of the eighth and ninth sets' rules found
/// they lost or took wrongly: each must stay fixed.
#[test]
fn review_of_the_eighth_and_ninth_sets_rules() {
    // Lost by the first cut of those rules, found again.
    finds(
        "phone",
        &[
            "Just in case: 415-555-0134",
            "Text Dana about the order 917-555-0148 tonight",
            "For the claim 917.555.0148 is best, ask for Rosa",
        ],
    );
    finds(
        "secret",
        &[
            "primary_key = \"q8Vx3Lm9Tz2Rw7Kp4Nb6Yc1Hd5Jf0Gs8Ua3Ei7Oq2Wm=\"",
            "\"primaryKey\": \"q8Vx3Lm9Tz2Rw7Kp4Nb6Yc1Hd5Jf0Gs8Ua3Ei7Oq2Wm=\"",
            "message_key = \"9fK2mQx7Lp3Zr8TnWv4BqLs6\"",
            "access_token=9fK2mQx7Lp3Zr8TnWv4BqL&redirect_uri=https://app.example.com/cb",
            "client_secret: 9fK2mQx7Lp3Zr8TnWv4BqL.example",
        ],
    );
    finds(
        "password",
        &[
            "The password for the router to access is Tiger#2024",
            "初始密码：请使用Abc@12345登录",
            "WiFi密码：需要的话是Abc12345",
            "Passwort: „$ommer2024“",
            "mot de passe : «$oleil42»",
            "пароль для почты это Lipa_2023!",
            "пароль от почты — Lipa_2023!",
            "كلمة المرور لحساب البنك هي Sahra#88_q",
        ],
    );
    let d = detector();
    for marked in [
        "Confidential informant CI-4471 is Marcus Dean, 41, who meets Det. Ruiz on Thursdays.",
        "Confidential client list: Hartmann and Ruiz are leaving us, public clients unaffected",
        "Add an \"Internal only\" label: Q3 layoffs list attached, Dana Ruiz and Omar Haddad.",
    ] {
        assert!(d.scan([marked]).contains(&CONFIDENTIAL), "{marked}");
    }
    // Taken wrongly by the first cut.
    misses(
        "password",
        &[
            "The A320neo uses the PW1100G engine.",
            "analogWrite(PWM_PIN, 128);",
            "import pwd\npwd.getpwnam('alice')",
            "An MDP M=(S,A,P,R) has states S",
            "Send the password for the wifi to Room-101 guests",
            "Where is the requirepass setting in Redis 7?",
            "# requirepass foobared",
            "masterauth option is needed on replicas",
        ],
    );
    assert!(
        !d.scan([
            "How long should my password be",
            "At least 12 characters is a good rule.",
            "16 enough?"
        ])
        .contains(&"password")
    );
    misses(
        "date-of-birth",
        &[
            "Finland joined NATO a year later, on 4 April 2023.",
            "Su tenacidad dio frutos el 12 de marzo de 2019.",
        ],
    );
    misses(
        "phone",
        &["The module supports GSM 850/900/1800/1900 MHz bands"],
    );
}

#[test]
fn shapes_from_the_tenth_development_set() {
    // VAT numbers without their country's prefix, each passing its
    // country's check after its tax word; the same digits one off fail.
    finds(
        "eu-vat",
        &[
            "P.IVA 01114601006 - Roma",
            "{\"partita_iva\": \"01114601006\", \"citta\": \"Roma\"}",
            "NIP: 526-025-02-74",
            "NIPC: 501964843",
            "CIF: A58818501",
            "NIF 12345678Z",
            "DIČ: CZ25596641",
            "ALV-numero FI20774740",
        ],
    );
    misses(
        "eu-vat",
        &[
            "P.IVA 01114601007 - Roma",
            "NIP: 526-025-02-75",
            "NIF 12345678A",
            "just 501964843 of them",
        ],
    );
    // Cisco's dotted MAC in a table whose header is far above; twelve
    // hex digits after the word; a dotted number is none.
    finds(
        "mac-address",
        &[
            "Vlan  Mac Address  Type\n----  -----------  --------  -----\n  10  7a3c.11be.04d2  DYNAMIC  Gi1/0/3",
            "the label says MAC 3C52A1B07E9F",
        ],
    );
    misses("mac-address", &["build 2024.1105.0930 is out"]);
    finds(
        "phone",
        &[
            "звоните 8 (925) 318-44-07 вечером",
            "pesan lewat WA 0813-2271-9045 ya",
            "SĐT 0903 218 447",
            "Cheers\nLiam\nP: 021 4927 731",
        ],
    );
    finds(
        "password",
        &[
            "kata sandi wifi rumah adalah Mangga#2291",
            "mật khẩu là Sen#7731 nhé",
            "my password is definitely Birch&Wren2030",
        ],
    );
    finds(
        "bank-account",
        &["Bankgiro 5050-1055", "No. rekening 7310452298 a.n. Budi"],
    );
    finds(
        "postal-address",
        &[
            "Hofladen Kranz · Am Anger 12 · 91074 Herzogenaurach",
            "Ci vediamo in Località Pian dei Mori 3, 53100 Siena",
            "Box 7, RR 1, Olds, AB T4H 1P3",
            "Jl. Sudirman No. 12, Jakarta",
            "Số 14, ngõ 51 phố Huế, Hà Nội",
            "lieu-dit Les Granges, 24200 Sarlat",
            "Unit 9, Kilshane Park, Dublin 11",
            "г. Казань, ул. Большая Красная, д. 5",
        ],
    );
    misses(
        "postal-address",
        &["We moved to Windows 11 across the team last spring"],
    );
}

/// What a review (helper) of the tenth set's rules found they lost or
/// took wrongly: each must stay fixed.
#[test]
fn review_of_the_tenth_sets_rules() {
    finds("mac-address", &["MAC address: 0050.5612.3456"]);
    finds(
        "password",
        &[
            "The password is Just-Kettle-22",
            "the password is probably_Tr0ub4dor",
            "password wifi kantor adalah Melati-2024",
            "passwordnya adalah Melati-2024",
            "mật khẩu wifi là Hoa#2024x",
        ],
    );
    finds(
        "eu-vat",
        &[
            "CIF: Q2826000H",
            "NIE: X2482300W",
            "NIF: 12345678-Z",
            "CIF: B-46143798",
        ],
    );
    misses(
        "eu-vat",
        &[
            "btw, my order number is 123456789",
            "The moms group raised 125.400.000 rupiah",
            "la cifra de 125.400.000 pesos",
            "Vattenfall customer number 4500012356",
            "Nippon Express tracking 4500012356",
            "c.f. ref 123456789",
            "Prices excl. VAT, PO 4500012356",
            "Subtotal 100.00, VAT 10.00 120.00",
            "VAT invoice 123456789",
            "tva incluse, commande n° 123456789",
        ],
    );
    misses(
        "postal-address",
        &[
            "Sold 7, 10000 Units",
            "Windows 11 · 25000 Devices",
            "Bài tập số 3 đường tròn nội tiếp tam giác",
            "Chương 2 Kinh tế, xã hội và môi trường",
            "Unit 4, Lesson 2: around Dublin 8",
        ],
    );
    misses(
        "phone",
        &[
            "Kyou no uriage wa 12 345 678 en deshita",
            "Assalamualaikum wa rahmatullahi, nomor pesanan 2024 1234 5678",
            "Results\nT: 2024-11-05 14:32:10",
            "Open the file\nP:\\Finance\\2024\\Invoice 12345678.pdf",
            "Invoice no. 0825-2024-0017",
        ],
    );
    misses(
        "bank-account",
        &[
            "Ik heb de rekening 2024-0173 van KPN nog niet betaald",
            "rekening listrik bulan ini 450000",
        ],
    );
    misses(
        "mac-address",
        &["On my Mac, docker ps shows container 3f9a2c1b7d4e running"],
    );
}
