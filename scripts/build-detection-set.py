#!/usr/bin/env python3
"""Build the labelled evaluation set for the sensitive-data detector:
tests/detection/eval.jsonl (read by host/src/detect/eval.rs and `edgeroute
bench`).

    python3 scripts/build-detection-set.py [--out tests/detection/eval.jsonl]

Python 3.11 standard library only, one fixed seed: two runs write the same
bytes. One JSON object per line:

  {"id": "payment-card-007", "messages": [{"role": "user", "content": "..."}],
   "kinds": ["payment-card"], "lang": "en", "variant": "spaces"}

`kinds` lists the sensitive kinds the prompt holds (empty: clean). Every
value is synthetic and, where the format has a check digit, valid (IBAN
ISO 13616 mod-97, Luhn, NHS mod-11, GB 11643 MOD 11-2, Verhoeff, ABA 3-7-1,
the national VAT checks); keys and tokens are random strings in the
providers' documented shapes. Each prompt is checked for accidental
collisions (a number that would also pass another kind's checksum, a stray
IPv4 address) and regenerated if it has one. See tests/detection/README.md.
"""
from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import json
import random
import re
import string
import sys
import unicodedata
import uuid
from pathlib import Path

SEED = 13616
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "detection" / "eval.jsonl"

KINDS = [
    "email", "payment-card", "iban", "us-ssn", "uk-nino", "nhs-number",
    "cn-resident-id", "in-aadhaar", "eu-vat", "passport", "bank-account",
    "phone", "postal-address", "date-of-birth", "ip-address", "mac-address",
    "api-key", "private-key", "jwt", "password", "secret", "confidential",
]
LANGS = ["en", "de", "fr", "es", "zh", "hi"]

rng = random.Random(SEED)

DIGITS = string.digits
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B32 = string.ascii_uppercase + "234567"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"


# --------------------------------------------------------------------------
# Check digits.
# --------------------------------------------------------------------------

def luhn_ok(d: str) -> bool:
    if not d.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(d)):
        x = int(ch)
        if i % 2 == 1:
            x *= 2
            if x > 9:
                x -= 9
        total += x
    return total % 10 == 0


def luhn_digit(body: str) -> str:
    return next(c for c in DIGITS if luhn_ok(body + c))


def iban_ok(s: str) -> bool:
    s = re.sub(r"[^0-9A-Za-z]", "", s).upper()
    r = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in r)) % 97 == 1


def make_iban(cc: str, bban: str) -> str:
    n = int("".join(str(int(c, 36)) for c in bban + cc + "00"))
    return f"{cc}{98 - n % 97:02d}{bban}"


def nhs_ok(d: str) -> bool:
    if len(d) != 10 or not d.isdigit():
        return False
    s = sum(int(c) * w for c, w in zip(d, range(10, 1, -1)))
    chk = (11 - s % 11) % 11
    return chk != 10 and chk == int(d[9])


CN_WEIGHTS = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]


def cn_check(body17: str) -> str:
    return "10X98765432"[sum(int(c) * w for c, w in zip(body17, CN_WEIGHTS)) % 11]


def cn_ok(s: str) -> bool:
    s = s.upper()
    return len(s) == 18 and s[:17].isdigit() and cn_check(s[:17]) == s[17]


V_D = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 0, 6, 7, 8, 9, 5],
    [2, 3, 4, 0, 1, 7, 8, 9, 5, 6], [3, 4, 0, 1, 2, 8, 9, 5, 6, 7],
    [4, 0, 1, 2, 3, 9, 5, 6, 7, 8], [5, 9, 8, 7, 6, 0, 4, 3, 2, 1],
    [6, 5, 9, 8, 7, 1, 0, 4, 3, 2], [7, 6, 5, 9, 8, 2, 1, 0, 4, 3],
    [8, 7, 6, 5, 9, 3, 2, 1, 0, 4], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
]
V_P = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 5, 7, 6, 2, 8, 3, 0, 9, 4],
    [5, 8, 0, 3, 7, 9, 6, 1, 4, 2], [8, 9, 1, 6, 0, 4, 3, 5, 2, 7],
    [9, 4, 5, 3, 1, 2, 6, 8, 7, 0], [4, 2, 8, 6, 5, 7, 3, 9, 0, 1],
    [2, 7, 9, 3, 8, 0, 6, 4, 1, 5], [7, 0, 4, 6, 9, 1, 3, 2, 5, 8],
]
V_INV = [0, 4, 3, 2, 1, 5, 6, 7, 8, 9]


def verhoeff_ok(d: str) -> bool:
    c = 0
    for i, ch in enumerate(reversed(d)):
        c = V_D[c][V_P[i % 8][int(ch)]]
    return c == 0


def verhoeff_digit(body: str) -> str:
    c = 0
    for i, ch in enumerate(reversed(body)):
        c = V_D[c][V_P[(i + 1) % 8][int(ch)]]
    return str(V_INV[c])


def aba_ok(d: str) -> bool:
    return len(d) == 9 and sum(
        int(c) * w for c, w in zip(d, [3, 7, 1] * 3)) % 10 == 0


def isbn13_digit(body12: str) -> str:
    s = sum(int(c) * (1 if i % 2 == 0 else 3) for i, c in enumerate(body12))
    return str((10 - s % 10) % 10)


def ipv4_ok(s: str) -> bool:
    parts = s.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts) \
        and any(p != "0" for p in parts)


# --------------------------------------------------------------------------
# Random pieces.
# --------------------------------------------------------------------------

def digits(n: int, first_nonzero: bool = False) -> str:
    s = "".join(rng.choice(DIGITS) for _ in range(n))
    if first_nonzero and s[0] == "0":
        s = rng.choice("123456789") + s[1:]
    return s


def rstr(n: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def mixed(n: int, alphabet: str = ALNUM) -> str:
    """Random, with lower case, upper case and digits all present."""
    while True:
        s = rstr(n, alphabet)
        if any(c.islower() for c in s) and any(c.isupper() for c in s) \
                and any(c.isdigit() for c in s):
            return s


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


NAMES = {
    "en": ["Emily Carter", "James Whitfield", "Olivia Nguyen", "Daniel Patel",
           "Sophie Morrison", "Marcus Hughes", "Hannah Bennett", "Ethan Reyes",
           "Chloe Fletcher", "Ryan Doyle"],
    "de": ["Lukas Keller", "Anna Brandt", "Jonas Vogel", "Lea Hartmann",
           "Felix Schuster", "Marie Lorenz"],
    "fr": ["Camille Martin", "Hugo Lefèvre", "Léa Garnier", "Louis Rousseau",
           "Manon Chevalier", "Théo Fontaine"],
    "es": ["Lucía García", "Pablo Moreno", "Carmen Navarro", "Javier Ortega",
           "Elena Castillo", "Diego Rubio"],
    "zh": ["王芳", "李伟", "张敏", "刘洋", "陈静", "杨磊", "赵丽", "黄鹏"],
    "hi": ["राहुल शर्मा", "प्रिया वर्मा", "अमित पटेल", "सुनीता यादव",
           "विकास गुप्ता", "नेहा सिंह"],
}
LATIN = {
    "en": ["emily.carter", "j.whitfield", "olivia.nguyen", "dpatel",
           "sophie.morrison", "marcus.hughes", "hannah.b", "ethan.reyes"],
    "de": ["lukas.keller", "anna.brandt", "j.vogel", "lea.hartmann", "fschuster"],
    "fr": ["camille.martin", "hugo.lefevre", "lea.garnier", "l.rousseau"],
    "es": ["lucia.garcia", "pablo.moreno", "c.navarro", "javier.ortega"],
    "zh": ["wangfang", "li.wei", "zhangmin88", "liuyang", "chen.jing"],
    "hi": ["rahul.sharma", "priya.verma", "amit.patel", "sunita.yadav"],
}
DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com",
           "corp.example.org", "staff.example.net"]


def name(lang: str) -> str:
    return rng.choice(NAMES[lang])


def gen_email(lang: str) -> str:
    local = rng.choice(LATIN[lang])
    if rng.random() < 0.35:
        local += str(rng.randint(1, 99))
    return f"{local}@{rng.choice(DOMAINS)}"


CARD_PREFIXES = [("4", 16), ("4", 16), ("51", 16), ("53", 16), ("55", 16),
                 ("2221", 16), ("2720", 16), ("34", 15), ("37", 15), ("6011", 16)]


def gen_card(_lang: str = "en") -> str:
    prefix, n = rng.choice(CARD_PREFIXES)
    body = prefix + digits(n - 1 - len(prefix))
    return body + luhn_digit(body)


def card_groups(raw: str) -> list[str]:
    if len(raw) == 15:
        return [raw[:4], raw[4:10], raw[10:]]
    return [raw[i:i + 4] for i in range(0, len(raw), 4)]


def bban(cc: str) -> str:
    if cc == "DE":
        return digits(8, True) + digits(10)
    if cc == "AT":
        return digits(5, True) + digits(11)
    if cc == "CH":
        return digits(5) + digits(12)
    if cc == "GB":
        return rng.choice(["NWBK", "BARC", "LOYD", "MIDL", "HBUK"]) + digits(14)
    if cc == "IE":
        return rng.choice(["AIBK", "BOFI"]) + digits(14)
    if cc == "NL":
        return rng.choice(["ABNA", "INGB", "RABO", "TRIO"]) + digits(10)
    if cc == "FR":
        bank, branch, acct = digits(5, True), digits(5), digits(11)
        key = 97 - (89 * int(bank) + 15 * int(branch) + 3 * int(acct)) % 97
        return f"{bank}{branch}{acct}{key:02d}"
    if cc == "ES":
        ent, off, acct = digits(4, True), digits(4), digits(10)

        def dc(s: str) -> int:
            w = [1, 2, 4, 8, 5, 10, 9, 7, 3, 6]
            v = 11 - sum(int(c) * x for c, x in zip(s, w)) % 11
            return {10: 1, 11: 0}.get(v, v)
        return f"{ent}{off}{dc('00' + ent + off)}{dc(acct)}{acct}"
    if cc == "BE":
        first = digits(10, True)
        return f"{first}{int(first) % 97 or 97:02d}"
    raise ValueError(cc)


IBAN_BY_LANG = {"en": ["GB", "IE", "NL"], "de": ["DE", "DE", "AT", "CH"],
                "fr": ["FR", "FR", "BE"], "es": ["ES"], "zh": ["DE", "FR"],
                "hi": ["GB"]}


def gen_iban(lang: str) -> str:
    cc = rng.choice(IBAN_BY_LANG[lang])
    v = make_iban(cc, bban(cc))
    assert iban_ok(v)
    return v


def gen_ssn(_lang: str = "en") -> str:
    while True:
        area = rng.randint(1, 899)
        if area == 666:
            continue
        s = f"{area:03d}{rng.randint(1, 99):02d}{rng.randint(1, 9999):04d}"
        if s not in ("078051120", "219099999", "123456789"):
            return s


NINO_FIRST = "ABCEGHJKLMNOPRSTWXYZ"     # not D F I Q U V
NINO_SECOND = "ABCEGHJKLMNPRSTWXYZ"     # not D F I O Q U V


def gen_nino(_lang: str = "en") -> str:
    while True:
        p = rng.choice(NINO_FIRST) + rng.choice(NINO_SECOND)
        if p not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ"):
            return p + digits(6) + rng.choice("ABCD")


def gen_nhs(_lang: str = "en") -> str:
    # 999 xxx xxxx: the range NHS England sets aside for test data.
    while True:
        body = "999" + digits(6)
        s = sum(int(c) * w for c, w in zip(body, range(10, 1, -1)))
        chk = (11 - s % 11) % 11
        if chk != 10:
            v = body + str(chk)
            assert nhs_ok(v)
            return v


CN_REGIONS = ["110101", "110105", "310104", "310115", "440106", "440305",
              "510107", "330106", "420106", "320102", "370202", "610113"]


def gen_cn(_lang: str = "zh") -> str:
    y, m, d = rng.randint(1955, 2004), rng.randint(1, 12), rng.randint(1, 28)
    body = rng.choice(CN_REGIONS) + f"{y:04d}{m:02d}{d:02d}" + digits(3)
    return body + cn_check(body)


def gen_aadhaar(_lang: str = "hi") -> str:
    body = rng.choice("23456789") + digits(10)
    v = body + verhoeff_digit(body)
    assert verhoeff_ok(v)
    return v


def gen_aba() -> str:
    prefixes = [f"{x:02d}" for x in [*range(1, 13), *range(21, 33), *range(61, 73), 80]]
    body = rng.choice(prefixes) + digits(6)
    s = sum(int(c) * w for c, w in zip(body, [3, 7, 1, 3, 7, 1, 3, 7]))
    v = body + str((10 - s % 10) % 10)
    assert aba_ok(v)
    return v


def vat_de() -> str:
    body = digits(8, True)
    p = 10
    for c in body:
        s = (int(c) + p) % 10 or 10
        p = (2 * s) % 11
    return f"DE{body}{(11 - p) % 10}"


def vat_fr() -> str:
    b = digits(8, True)
    siren = b + luhn_digit(b)
    return f"FR{(12 + 3 * (int(siren) % 97)) % 97:02d}{siren}"


def vat_it() -> str:
    body = digits(7, True) + f"{rng.randint(1, 100):03d}"
    return "IT" + body + luhn_digit(body)


def vat_nl() -> str:
    while True:
        b = digits(8, True)
        s = sum(int(c) * w for c, w in zip(b, range(9, 1, -1))) % 11
        if s < 10:
            return f"NL{b}{s}B01"


def vat_es() -> str:
    d = digits(7, True)
    even = sum(int(d[i]) for i in (1, 3, 5))
    odd = sum(sum(divmod(2 * int(d[i]), 10)) for i in (0, 2, 4, 6))
    return f"ESB{d}{(10 - (even + odd) % 10) % 10}"


def vat_be() -> str:
    body = "0" + digits(7, True)
    return f"BE{body}{97 - int(body) % 97:02d}"


VAT_BY_LANG = {"de": [vat_de], "fr": [vat_fr, vat_be], "es": [vat_es],
               "en": [vat_it, vat_nl, vat_be, vat_de], "zh": [vat_de, vat_fr],
               "hi": [vat_nl]}


def gen_vat(lang: str) -> str:
    return rng.choice(VAT_BY_LANG[lang])()


def gen_passport(lang: str) -> str:
    if lang == "en":
        return digits(9, True)                      # US / UK: 9 digits
    if lang == "de":
        return "C" + rstr(8, "CFGHJKLMNPRTVWXYZ0123456789")
    if lang == "fr":
        return f"{digits(2)}{rstr(2, string.ascii_uppercase)}{digits(5)}"
    if lang == "es":
        return rstr(3, string.ascii_uppercase) + digits(6)
    if lang == "zh":
        return "E" + digits(8, True)
    return rng.choice("JKLMNPRSTUVZ") + digits(7, True)   # India


def gen_dob(lang: str, iso: bool = False) -> str:
    y, m, d = rng.randint(1950, 2004), rng.randint(1, 12), rng.randint(1, 28)
    if iso:
        return f"{y:04d}-{m:02d}-{d:02d}"
    en_months = ["January", "February", "March", "April", "May", "June", "July",
                 "August", "September", "October", "November", "December"]
    fr_months = ["janvier", "février", "mars", "avril", "mai", "juin", "juillet",
                 "août", "septembre", "octobre", "novembre", "décembre"]
    es_months = ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio",
                 "agosto", "septiembre", "octubre", "noviembre", "diciembre"]
    if lang == "en":
        return rng.choice([f"{d} {en_months[m - 1]} {y}", f"{en_months[m - 1]} {d}, {y}",
                           f"{m:02d}/{d:02d}/{y}", f"{y}-{m:02d}-{d:02d}"])
    if lang == "de":
        return f"{d:02d}.{m:02d}.{y}"
    if lang == "fr":
        return rng.choice([f"{d} {fr_months[m - 1]} {y}", f"{d:02d}/{m:02d}/{y}"])
    if lang == "es":
        return rng.choice([f"{d:02d}/{m:02d}/{y}", f"{d} de {es_months[m - 1]} de {y}"])
    if lang == "zh":
        return f"{y}年{m}月{d}日"
    return f"{d:02d}/{m:02d}/{y}"


def gen_phone(lang: str, variant: str) -> str:
    r = rng.randint
    if variant == "intl-phone":
        return rng.choice({
            "en": [f"+44 20 7946 0{r(0, 999):03d}", f"+44 7700 900{r(0, 999):03d}",
                   f"+1 202-555-01{r(0, 99):02d}"],
            "de": [f"+49 30 {r(2000, 9999)} {r(1000, 9999)}",
                   f"+49 151 {r(1000, 9999)} {r(1000, 9999)}"],
            "fr": [f"+33 1 99 00 {r(0, 99):02d} {r(0, 99):02d}",
                   f"+33 6 39 98 {r(0, 99):02d} {r(0, 99):02d}"],
            "es": [f"+34 6{r(10, 99)} {r(100, 999)} {r(100, 999)}"],
            "zh": [f"+86 138 {r(1000, 9999)} {r(1000, 9999)}",
                   f"+86 139{r(1000, 9999)}{r(1000, 9999)}"],
            "hi": [f"+91 98{r(100, 999)} {r(10000, 99999)}",
                   f"+91-98{r(100, 999)}-{r(10000, 99999)}"],
        }[lang])
    return rng.choice({
        "en": [f"(312) 555-01{r(0, 99):02d}", f"020 7946 0{r(0, 999):03d}",
               f"07700 900{r(0, 999):03d}"],
        "de": [f"030 {r(2000, 9999)} {r(1000, 9999)}", f"0151 {r(1000, 9999)} {r(1000, 9999)}"],
        "fr": [f"01 99 00 {r(0, 99):02d} {r(0, 99):02d}", f"06 39 98 {r(0, 99):02d} {r(0, 99):02d}"],
        "es": [f"91 {r(100, 999)} {r(10, 99)} {r(10, 99)}", f"6{r(10, 99)} {r(100, 999)} {r(100, 999)}"],
        "zh": [f"139{r(1000, 9999)}{r(1000, 9999)}", f"010-6552 {r(1000, 9999)}",
               f"0755-8612 {r(1000, 9999)}"],
        "hi": [f"098{r(100, 999)} {r(10000, 99999)}", f"022 {r(2000, 2999)} {r(1000, 9999)}"],
    }[lang])


UK_AREAS = [("Leeds", "LS6"), ("Bristol", "BS7"), ("Manchester", "M14"),
            ("Norwich", "NR2"), ("Cardiff", "CF24"), ("York", "YO10")]
POSTCODE_LETTERS = "ABDEFGHJLNPQRSTUWXYZ"


def gen_address(lang: str) -> str:
    r = rng.randint
    if lang == "en":
        if rng.random() < 0.5:
            street = rng.choice(["Maple", "Oak", "Cedar", "Willow", "Lakeview", "Sunset", "Highland"])
            suffix = rng.choice(["Street", "Avenue", "Drive", "Lane", "Road", "Court"])
            city, st, z = rng.choice([("Springfield", "IL", "627"), ("Columbus", "OH", "432"),
                                      ("Austin", "TX", "787"), ("Portland", "OR", "972"),
                                      ("Madison", "WI", "537"), ("Raleigh", "NC", "276")])
            apt = rng.choice(["", f", Apt {r(1, 30)}{rng.choice('ABCD')}"])
            return f"{r(10, 9899)} {street} {suffix}{apt}, {city}, {st} {z}{r(0, 99):02d}"
        street = rng.choice(["Rosebery", "Kingsley", "Alder", "Mill", "Station", "Victoria"])
        suffix = rng.choice(["Road", "Street", "Close", "Crescent", "Lane"])
        town, out = rng.choice(UK_AREAS)
        inward = f"{r(1, 9)}{rng.choice(POSTCODE_LETTERS)}{rng.choice(POSTCODE_LETTERS)}"
        return f"{r(1, 180)} {street} {suffix}, {town} {out} {inward}"
    if lang == "de":
        street = rng.choice(["Linden", "Goethe", "Schiller", "Bahnhof", "Kastanien", "Birken"])
        suffix = rng.choice(["straße", "weg", "allee", "str."])
        plz, city = rng.choice([("10115", "Berlin"), ("80331", "München"), ("50667", "Köln"),
                                ("20095", "Hamburg"), ("04109", "Leipzig")])
        return f"{street}{suffix} {r(1, 140)}, {plz} {city}"
    if lang == "fr":
        rue = rng.choice(["rue des Lilas", "rue Victor Hugo", "avenue de la République",
                          "rue Pasteur", "boulevard des Écoles"])
        cp, city = rng.choice([("75011", "Paris"), ("69003", "Lyon"), ("31000", "Toulouse"),
                               ("33000", "Bordeaux"), ("44000", "Nantes")])
        return f"{r(1, 120)} {rue}, {cp} {city}"
    if lang == "es":
        calle = rng.choice(["Calle Mayor", "Calle de Alcalá", "Calle del Sol",
                            "Avenida de San Vicente", "Gran Vía"])
        cp, city = rng.choice([("28013", "Madrid"), ("08001", "Barcelona"),
                               ("41001", "Sevilla"), ("46002", "Valencia")])
        return f"{calle} {r(1, 150)}, {r(1, 8)}º {rng.choice('ABCD')}, {cp} {city}"
    if lang == "zh":
        city, district, road = rng.choice([
            ("北京市", "朝阳区", "建国路"), ("上海市", "徐汇区", "漕溪北路"),
            ("广州市", "天河区", "天河路"), ("深圳市", "南山区", "科技园南路"),
            ("成都市", "武侯区", "人民南路")])
        return f"{city}{district}{road}{r(1, 300)}号{r(1, 12)}栋{r(1, 4)}单元{r(1, 30)}0{r(1, 6)}室"
    area, city, pin = rng.choice([("Indiranagar", "Bengaluru", "5600"), ("Andheri West", "Mumbai", "4000"),
                                  ("Salt Lake", "Kolkata", "7000"), ("Vaishali Nagar", "Jaipur", "3020")])
    return (f"Flat {r(1, 40)}{rng.choice('ABC')}, {rng.choice(['Shanti', 'Sai Krupa', 'Green Park'])} "
            f"Apartments, {r(1, 200)} MG Road, {area}, {city} {pin}{r(10, 99)}")


def gen_ip(kind: str = "doc") -> str:
    r = rng.randint
    if kind == "private":
        return rng.choice([f"10.{r(0, 40)}.{r(0, 255)}.{r(2, 254)}", f"192.168.{r(0, 20)}.{r(2, 254)}",
                           f"172.{r(16, 31)}.{r(0, 255)}.{r(2, 254)}"])
    return rng.choice([f"192.0.2.{r(2, 254)}", f"198.51.100.{r(2, 254)}", f"203.0.113.{r(2, 254)}"])


def gen_ipv6() -> str:
    return f"2001:db8:{rng.randint(1, 0xffff):x}::{rng.randint(1, 0xffff):x}:{rng.randint(1, 0xffff):x}"


def gen_mac(sep: str = ":", upper: bool = False) -> str:
    octets = [(rng.randint(0, 255) & 0xFC) | 0x02] + [rng.randint(0, 255) for _ in range(5)]
    s = sep.join(f"{o:02x}" for o in octets)   # locally administered: never a vendor OUI
    return s.upper() if upper else s


def gen_password() -> str:
    words = ["Tangerine", "Harbor", "Falcon", "Meadow", "Copper", "Velvet", "Summit",
             "Orchid", "Lantern", "Glacier", "Pebble", "Nimbus"]
    return (rng.choice(words) + rng.choice(["", "-", "_", "."]) + rng.choice(words).lower()
            + str(rng.randint(10, 9999)) + rng.choice("!*~-_"))


# Provider key formats.
def aws_key_id() -> str:
    return "AKIA" + rstr(16, B32)


def aws_secret() -> str:
    return mixed(40, B64)


def gh_classic() -> str:
    return "ghp_" + mixed(36)


def gh_fine() -> str:
    return "github_pat_" + mixed(22) + "_" + mixed(59)


def glpat() -> str:
    return "glpat-" + mixed(20, B64URL)


def slack_bot() -> str:
    return f"xoxb-{digits(12, True)}-{digits(13, True)}-{mixed(24)}"


def slack_user() -> str:
    return f"xoxp-{digits(12, True)}-{digits(12, True)}-{digits(13, True)}-{rstr(32, HEX)}"


def stripe(prefix: str = "sk_live_") -> str:
    return prefix + mixed(rng.choice([24, 99]))


def openai_key() -> str:
    return "sk-proj-" + mixed(74, B64URL) + "T3BlbkFJ" + mixed(74, B64URL)


def anthropic_key() -> str:
    return "sk-ant-api03-" + mixed(93, B64URL) + "AA"


def google_key() -> str:
    return "AIza" + mixed(35, B64URL)


def twilio_key() -> str:
    return "SK" + rstr(32, HEX)


def sendgrid_key() -> str:
    return f"SG.{mixed(22, B64URL)}.{mixed(43, B64URL)}"


def azure_conn() -> str:
    key = base64.b64encode(rng.randbytes(64)).decode()
    return (f"DefaultEndpointsProtocol=https;AccountName=contosodata{rng.randint(10, 99)};"
            f"AccountKey={key};EndpointSuffix=core.windows.net")


def npm_token() -> str:
    return "npm_" + mixed(36)


def hf_token() -> str:
    return "hf_" + mixed(34, string.ascii_letters + string.digits)


PEM_TYPES = [
    ("RSA PRIVATE KEY", "MIIEpAIBAAKCAQEA", 25),
    ("PRIVATE KEY", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQ", 26),
    ("EC PRIVATE KEY", "MHcCAQEEI", 3),
    ("OPENSSH PRIVATE KEY", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
                            "QyNTUxOQAAACD", 7),
    ("ENCRYPTED PRIVATE KEY", "MIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI", 27),
]


def gen_pem(which: int | None = None) -> str:
    label, prefix, lines = PEM_TYPES[rng.randrange(len(PEM_TYPES)) if which is None else which]
    total = lines * 64 - rng.randint(4, 40)
    body = prefix + base64.b64encode(rng.randbytes(total)).decode()
    body = body[:total]
    wrapped = "\n".join(body[i:i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{wrapped}\n-----END {label}-----"


def gen_jwt(alg: str = "HS256") -> str:
    header = b64u(json.dumps({"alg": alg, "typ": "JWT"}, separators=(",", ":")).encode())
    iat = 1717000000 + rng.randint(0, 20_000_000)
    payload = {"sub": str(rng.randint(10 ** 5, 10 ** 7)),
               "name": rng.choice(NAMES["en"]),
               "role": rng.choice(["admin", "editor", "viewer"]),
               "iat": iat, "exp": iat + 3600}
    body = b64u(json.dumps(payload, separators=(",", ":")).encode())
    sig = b64u(rng.randbytes(32 if alg == "HS256" else 256))
    return f"{header}.{body}.{sig}"


# --------------------------------------------------------------------------
# Rendering a number (variants).
# --------------------------------------------------------------------------

FULLWIDTH = str.maketrans("0123456789X", "０１２３４５６７８９Ｘ")
ZWSP = "\u200b"

GROUPS = {
    "payment-card": card_groups,
    "iban": lambda s: [s[i:i + 4] for i in range(0, len(s), 4)],
    "us-ssn": lambda s: [s[:3], s[3:5], s[5:]],
    "uk-nino": lambda s: [s[:2], s[2:4], s[4:6], s[6:8], s[8:]],
    "nhs-number": lambda s: [s[:3], s[3:6], s[6:]],
    "cn-resident-id": lambda s: [s[:6], s[6:14], s[14:]],
    "in-aadhaar": lambda s: [s[:4], s[4:8], s[8:]],
}
# How each number is usually written when nothing unusual is done to it
# (inside JSON, code and config, and for the zero-width variant).
USUAL = {"payment-card": "compact", "iban": "compact", "us-ssn": "dashes",
         "uk-nino": "spaces", "nhs-number": "spaces", "cn-resident-id": "compact",
         "in-aadhaar": "spaces"}


def render(kind: str, raw: str, variant: str) -> str:
    g = GROUPS[kind](raw)
    if variant in ("json", "code", "config"):
        variant = USUAL[kind]
    if variant == "compact":
        return raw
    if variant == "spaces":
        return " ".join(g)
    if variant == "dashes":
        return "-".join(g)
    if variant == "dots":
        return ".".join(g)
    if variant == "lowercase":
        return " ".join(g).lower()
    if variant == "fullwidth":
        sep = "-" if kind == "us-ssn" else " "
        return (raw if kind == "cn-resident-id" else sep.join(g)).translate(FULLWIDTH)
    if variant == "zero-width":
        usual = render(kind, raw, USUAL[kind])
        # Between two digits near the middle.
        mid = len(usual) // 2
        while not (usual[mid - 1].isalnum() and usual[mid].isalnum()):
            mid += 1
        return usual[:mid] + ZWSP + usual[mid:]
    raise ValueError(variant)


def split_halves(kind: str, value: str) -> tuple[str, str]:
    if kind == "postal-address":
        a, b = value.split(", ", 1)
        return a + ",", b
    parts = value.split(" ")
    k = len(parts) // 2
    return " ".join(parts[:k]), " ".join(parts[k:])


ACK = {"en": "Got it. And the rest?", "de": "Verstanden – und der Rest?",
       "fr": "D'accord, et la suite ?", "es": "Vale, ¿y el resto?",
       "zh": "好的，请继续。", "hi": "ठीक है, आगे बताइए।"}

ASK = {
    "json": {"en": "Why does the API reject this payload?",
             "de": "Warum lehnt die API diesen Payload ab?",
             "fr": "Pourquoi l'API rejette-t-elle ce JSON ?",
             "es": "¿Por qué la API rechaza este JSON?",
             "zh": "为什么接口拒绝这个JSON？",
             "hi": "API यह JSON क्यों reject कर रहा है?"},
    "code": {"en": "Can you turn this snippet into a reusable function?",
             "de": "Kannst du dieses Snippet in eine Funktion umbauen?",
             "fr": "Peux-tu transformer ce code en fonction réutilisable ?",
             "es": "¿Puedes convertir este código en una función?",
             "zh": "能帮我把这段代码改成一个函数吗？",
             "hi": "इस code को एक function में बदल दीजिए।"},
    "config": {"en": "Is this YAML valid? The loader fails on it.",
               "de": "Ist dieses YAML gültig? Der Parser bricht ab.",
               "fr": "Ce YAML est-il valide ? Le parseur échoue.",
               "es": "¿Es válido este YAML? El parser falla.",
               "zh": "这个YAML格式对吗？解析一直报错。",
               "hi": "क्या यह YAML सही है? parser fail हो रहा है।"},
}


def wrap(variant: str, lang: str, pairs: list[tuple[str, str]]) -> str:
    ask = ASK[variant][lang]
    if variant == "json":
        body = json.dumps(dict(pairs), ensure_ascii=False, indent=2)
        return f"{ask}\n\n```json\n{body}\n```"
    if variant == "code":
        lines = ["record = {}"] + [f"record[{json.dumps(k)}] = {json.dumps(v, ensure_ascii=False)}"
                                   for k, v in pairs] + ["db.customers.insert(record)"]
        return f"{ask}\n\n```python\n" + "\n".join(lines) + "\n```"
    if variant == "config":
        lines = ["customer:"] + [f"  {k}: {json.dumps(v, ensure_ascii=False)}" for k, v in pairs] \
            + ["  status: active"]
        return f"{ask}\n\n```yaml\n" + "\n".join(lines) + "\n```"
    raise ValueError(variant)


# --------------------------------------------------------------------------
# Templates for identifiers ({v}: the value; {name}: a person's name).
# Kinds that need context have the context word shortly before {v}.
# --------------------------------------------------------------------------

TPL: dict[str, dict[str, list[str]]] = {
    "email": {
        "en": ["Can you draft a reply to {v} saying the shipment is delayed until next week?",
               "Please add {v} to the invite list for the Berlin meetup.",
               "My email is {v} and I'm not receiving the verification link. What should I check?"],
        "de": ["Schreib bitte eine höfliche Absage an {v} wegen des Termins am Freitag."],
        "fr": ["Peux-tu écrire un e-mail de relance à {v} pour la facture en retard ?"],
        "es": ["Redacta un correo para {v} confirmando la reserva de la sala."],
        "zh": ["帮我给 {v} 写一封邮件，通知他下周一的会议改到下午三点。",
               "客户的邮箱是{v}，帮我写一封道歉信。"],
        "hi": ["कृपया {v} को एक ईमेल लिखें कि मीटिंग अगले सोमवार को है।"],
    },
    "payment-card": {
        "en": ["I was charged twice on my card {v} at the same shop — how do I dispute the second charge?",
               "My card number is {v}, expiry 09/28. Why does the checkout page say it's invalid?",
               "Which bank issued the card {v}? The payment keeps failing."],
        "de": ["Meine Kreditkarte {v} wurde im Onlineshop abgelehnt – woran kann das liegen?",
               "Kartennummer {v}, gültig bis 11/27 – warum klappt die Zahlung nicht?"],
        "fr": ["Ma carte bancaire {v} a été débitée deux fois, comment contester ?"],
        "es": ["Mi tarjeta {v} fue rechazada en la web de la aerolínea, ¿qué hago?"],
        "zh": ["我的信用卡号是 {v}，为什么网上支付一直失败？",
               "这张卡 {v} 被扣了两次款，怎么申请退款？"],
        "hi": ["मेरे क्रेडिट कार्ड {v} से दो बार पैसे कट गए, अब क्या करूँ?"],
    },
    "iban": {
        "en": ["Please send the refund to IBAN {v} (account holder: {name}).",
               "Is {v} a valid IBAN? The transfer form rejects it."],
        "de": ["Bitte überweisen Sie den Betrag auf folgende IBAN: {v} (Kontoinhaber: {name}).",
               "Meine neue IBAN lautet {v}, bitte für die Lastschrift hinterlegen."],
        "fr": ["Voici mon IBAN pour le remboursement : {v}.",
               "Pouvez-vous vérifier l'IBAN {v} avant que je fasse le virement ?"],
        "es": ["Mi IBAN es {v}, ¿podéis hacer la devolución ahí?"],
        "zh": ["请把退款打到这个IBAN：{v}，收款人{name}。"],
        "hi": ["रिफ़ंड इस IBAN पर भेज दीजिए: {v}"],
    },
    "us-ssn": {
        "en": ["My SSN is {v} and the IRS e-file keeps rejecting my return — is something wrong with the number?",
               "Fill in this W-9 for me: name {name}, SSN {v}.",
               "Social Security number {v} — is that formatted correctly for the I-9 form?"],
        "es": ["Mi número de Seguro Social (SSN) es {v}; ¿cómo lo pongo en el formulario W-4?"],
        "zh": ["我在美国的社会安全号 SSN 是 {v}，报税表应该填在哪里？"],
        "hi": ["मेरा SSN {v} है, W-2 फॉर्म में इसे कहाँ लिखूँ?"],
    },
    "uk-nino": {
        "en": ["My National Insurance number is {v} — how do I check my contribution record?",
               "New starter details: {name}, NI number {v}, start date 2 June.",
               "HMRC's letter quotes {v}; is that a valid NINO?"],
        "de": ["Meine britische National-Insurance-Nummer lautet {v} – wo trage ich sie ein?"],
        "fr": ["Mon numéro de National Insurance britannique est {v} ; comment le transmettre à mon employeur ?"],
        "es": ["Mi número de National Insurance es {v}, ¿dónde lo pongo en el formulario?"],
        "zh": ["我的英国国民保险号（NI number）是 {v}，怎么查询缴费记录？"],
        "hi": ["मेरा National Insurance नंबर {v} है, इसे नए employer को कैसे दूँ?"],
    },
    "nhs-number": {
        "en": ["Patient NHS number {v} missed two appointments — draft a polite reminder letter.",
               "My NHS number is {v}. How do I register with a new GP after moving?",
               "Referral form: patient {name}, NHS no. {v} — can you lay this out as a table?"],
        "de": ["Meine NHS-Nummer ist {v}; wie melde ich mich bei einer neuen Praxis in London an?"],
        "fr": ["Mon numéro NHS est {v}, comment changer de médecin traitant à Londres ?"],
        "es": ["Mi número del NHS es {v}, ¿cómo pido cita con el médico de cabecera?"],
        "zh": ["我在英国看病，NHS号码是 {v}，怎么预约全科医生？"],
        "hi": ["मेरा NHS number {v} है, नया GP कैसे चुनें?"],
    },
    "cn-resident-id": {
        "zh": ["我的身份证号是{v}，帮我看看填得对不对。",
               "请核对乘客身份证号码：{v}（姓名：{name}）。",
               "酒店入住登记，身份证号 {v}，这样格式对吗？"],
        "en": ["What does the region code in this Chinese resident ID mean: {v}?"],
        "de": ["Mein Kollege aus Shanghai hat mir seine ID-Nummer {v} geschickt – was bedeutet die letzte Stelle?"],
        "fr": ["Que signifient les six premiers chiffres de la carte d'identité chinoise {v} ?"],
        "es": ["¿Cómo compruebo si el documento de identidad chino {v} es válido?"],
        "hi": ["इस चीनी पहचान संख्या {v} में region code कौन सा है?"],
    },
    "in-aadhaar": {
        "hi": ["मेरा आधार नंबर {v} है, इसे PAN से लिंक कैसे करूँ?",
               "आधार {v} पर OTP नहीं आ रहा, क्या करूँ?"],
        "en": ["My Aadhaar number is {v} and the bank's KYC portal keeps rejecting it.",
               "Which documents do I need to update the address on Aadhaar {v}?"],
        "zh": ["印度同事的Aadhaar号码是 {v}，这个格式对吗？"],
        "de": ["Meine indische Aadhaar-Nummer ist {v} – brauche ich sie für das Visum?"],
        "fr": ["Mon numéro Aadhaar est {v} ; faut-il le fournir pour louer un appartement à Pune ?"],
    },
    "eu-vat": {
        "de": ["Unsere USt-IdNr. lautet {v}. Bitte auf der Rechnung ergänzen.",
               "Bitte prüfe, ob die Umsatzsteuer-ID {v} gültig ist."],
        "fr": ["Notre numéro de TVA intracommunautaire est {v}, merci de corriger la facture.",
               "Le client nous a donné le n° TVA {v} ; est-il valide ?"],
        "es": ["Nuestro NIF-IVA es {v}; ¿cómo lo incluyo en la factura?"],
        "en": ["Please add our VAT number {v} to the invoice header.",
               "Is the VAT ID {v} valid for a reverse-charge invoice?"],
        "zh": ["我们在欧洲的增值税号是 {v}，开票时怎么写？"],
        "hi": ["हमारी कंपनी का EU VAT नंबर {v} है, invoice में कहाँ डालें?"],
    },
    "passport": {
        "en": ["My passport number is {v}; it expires in 2031. Do I need a visa for Japan?",
               "Fill in the booking: passenger {name}, passport {v}, nationality British."],
        "de": ["Meine Reisepassnummer ist {v} – muss ich sie beim ESTA-Antrag angeben?"],
        "fr": ["Mon numéro de passeport est {v}, est-ce que je dois le renseigner pour l'ESTA ?"],
        "es": ["Mi número de pasaporte es {v}; ¿lo necesito para facturar online?"],
        "zh": ["我的护照号码是{v}，签证申请表上应该怎么填？", "护照号 {v}，帮我检查一下机票信息。"],
        "hi": ["मेरा passport नंबर {v} है, वीज़ा फॉर्म में कहाँ भरूँ?"],
    },
    "postal-address": {
        "en": ["Please ship the replacement to {v}.",
               "Is {v} inside the same-day delivery zone?"],
        "de": ["Bitte schicken Sie die Unterlagen an {v}."],
        "fr": ["Merci d'envoyer le colis à l'adresse suivante : {v}."],
        "es": ["Envíen el pedido a {v}, por favor."],
        "zh": ["请把快递寄到{v}，收件人{name}。", "我的新地址是{v}，帮我写一封地址变更通知。"],
        "hi": ["कृपया पार्सल इस पते पर भेजें: {v}"],
    },
    "date-of-birth": {
        "en": ["Born {v} — how old will I be on 1 January 2030?",
               "My DOB is {v}; the insurance form says I'm under 18, is that right?",
               "Date of birth: {v}. When can I start drawing my state pension?"],
        "de": ["Ich bin geboren am {v} – wie viele Tage alt bin ich heute?"],
        "fr": ["Je suis née le {v}, quel âge aurai-je en 2030 ?"],
        "es": ["Mi fecha de nacimiento es {v}; ¿a qué edad me puedo jubilar?"],
        "zh": ["我的出生日期是{v}，今年多大了？"],
        "hi": ["मेरी जन्म तिथि (DOB) {v} है, मेरी उम्र कितनी है?"],
    },
}

FIELD = {"email": "email", "payment-card": "card_number", "iban": "iban", "us-ssn": "ssn",
         "uk-nino": "ni_number", "nhs-number": "nhs_number", "cn-resident-id": "id_card_no",
         "in-aadhaar": "aadhaar", "eu-vat": "vat_id", "passport": "passport_no",
         "postal-address": "shipping_address", "date-of-birth": "date_of_birth", "phone": "phone"}

GEN = {"email": gen_email, "payment-card": gen_card, "iban": gen_iban, "us-ssn": gen_ssn,
       "uk-nino": gen_nino, "nhs-number": gen_nhs, "cn-resident-id": gen_cn,
       "in-aadhaar": gen_aadhaar, "eu-vat": gen_vat, "passport": gen_passport,
       "postal-address": gen_address, "date-of-birth": gen_dob}

# (lang, variant) for each prompt of a kind.
PLANS = {
    "email": [("en", "plain"), ("en", "plain"), ("en", "plain"), ("en", "json"), ("en", "config"),
              ("en", "code"), ("de", "plain"), ("fr", "plain"), ("es", "plain"), ("zh", "plain"),
              ("zh", "plain"), ("hi", "plain"), ("de", "json")],
    "payment-card": [("en", "spaces"), ("en", "compact"), ("en", "dashes"), ("en", "split"),
                     ("de", "spaces"), ("fr", "compact"), ("es", "dashes"), ("zh", "fullwidth"),
                     ("zh", "spaces"), ("hi", "zero-width"), ("en", "json"), ("en", "zero-width"),
                     ("de", "split")],
    "iban": [("de", "compact"), ("de", "spaces"), ("de", "lowercase"), ("fr", "spaces"),
             ("fr", "split"), ("es", "spaces"), ("en", "compact"), ("en", "json"),
             ("en", "zero-width"), ("zh", "spaces"), ("hi", "compact"), ("es", "lowercase"),
             ("en", "config")],
    "us-ssn": [("en", "dashes"), ("en", "dashes"), ("en", "spaces"), ("en", "dots"),
               ("en", "compact"), ("en", "compact"), ("en", "json"), ("en", "fullwidth"),
               ("es", "dashes"), ("es", "compact"), ("zh", "dashes"), ("hi", "dashes"),
               ("en", "zero-width")],
    "uk-nino": [("en", "spaces"), ("en", "spaces"), ("en", "compact"), ("en", "json"),
                ("en", "lowercase"), ("en", "code"), ("hi", "spaces"), ("zh", "compact"),
                ("fr", "spaces"), ("de", "compact"), ("es", "spaces"), ("en", "zero-width")],
    "nhs-number": [("en", "spaces"), ("en", "spaces"), ("en", "compact"), ("en", "dashes"),
                   ("en", "split"), ("en", "json"), ("en", "zero-width"), ("hi", "spaces"),
                   ("zh", "spaces"), ("fr", "compact"), ("de", "spaces"), ("es", "spaces"),
                   ("en", "config")],
    "cn-resident-id": [("zh", "compact"), ("zh", "compact"), ("zh", "compact"), ("zh", "fullwidth"),
                       ("zh", "fullwidth"), ("zh", "spaces"), ("zh", "json"), ("zh", "zero-width"),
                       ("en", "compact"), ("en", "code"), ("de", "compact"), ("fr", "compact"),
                       ("hi", "compact"), ("es", "compact")],
    "in-aadhaar": [("hi", "spaces"), ("hi", "spaces"), ("hi", "compact"), ("hi", "dashes"),
                   ("hi", "fullwidth"), ("en", "spaces"), ("en", "compact"), ("en", "split"),
                   ("en", "json"), ("en", "zero-width"), ("zh", "spaces"), ("de", "spaces"),
                   ("fr", "spaces")],
    "eu-vat": [("de", "plain"), ("de", "plain"), ("de", "plain"), ("fr", "plain"), ("fr", "plain"),
               ("es", "plain"), ("es", "plain"), ("en", "plain"), ("en", "plain"), ("en", "json"),
               ("de", "spaces"), ("fr", "spaces"), ("zh", "plain"), ("hi", "plain")],
    "passport": [("en", "plain"), ("en", "plain"), ("en", "plain"), ("de", "plain"),
                 ("fr", "plain"), ("es", "plain"), ("zh", "plain"), ("zh", "plain"),
                 ("hi", "plain"), ("en", "json"), ("en", "code"), ("de", "config")],
    "postal-address": [("en", "plain"), ("en", "plain"), ("en", "plain"), ("de", "plain"),
                       ("fr", "plain"), ("es", "plain"), ("zh", "plain"), ("zh", "plain"),
                       ("hi", "plain"), ("en", "json"), ("de", "json"), ("en", "split")],
    "date-of-birth": [("en", "plain"), ("en", "plain"), ("en", "plain"), ("de", "plain"),
                      ("fr", "plain"), ("es", "plain"), ("zh", "plain"), ("zh", "fullwidth"),
                      ("hi", "plain"), ("en", "json"), ("de", "config"), ("en", "code")],
}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def fill(tpl: str, lang: str, **values: str) -> str:
    out = tpl.replace("{name}", name(lang))
    for k, v in values.items():
        out = out.replace("{" + k + "}", v)
    return out


def identifier_item(kind: str, lang: str, variant: str):
    tpl = rng.choice(TPL[kind][lang])
    if kind in GROUPS:
        raw = GEN[kind](lang)
        if kind == "cn-resident-id":
            assert cn_ok(raw)
        if kind == "payment-card":
            assert luhn_ok(raw)
        # A split value is written with spaces and cut between two groups.
        value = render(kind, raw, "spaces" if variant == "split" else variant)
    elif kind == "eu-vat":
        raw = gen_vat(lang)
        value = raw
        if variant == "spaces":
            cc, rest = raw[:2], raw[2:]
            value = cc + " " + " ".join(rest[i:i + 3] for i in range(0, len(rest), 3))
    elif kind == "date-of-birth":
        value = gen_dob(lang, iso=variant in ("json", "config", "code"))
        if variant == "fullwidth":
            value = value.translate(FULLWIDTH)
    else:
        value = GEN[kind](lang)

    if variant in ("json", "code", "config"):
        text = wrap(variant, lang, [("name", name(lang)), (FIELD[kind], value)])
        return user(text), [kind]
    if variant == "split":
        a, b = split_halves(kind, value)
        pre, post = fill(tpl, lang).split("{v}")
        return [{"role": "user", "content": pre + a},
                {"role": "assistant", "content": ACK[lang]},
                {"role": "user", "content": b + post}], [kind]
    return user(fill(tpl, lang, v=value)), [kind]


# --------------------------------------------------------------------------
# Bank accounts, phones, landmark addresses.
# --------------------------------------------------------------------------

def bank_items():
    def sc():
        return f"{rng.randint(10, 99)}-{digits(2)}-{digits(2)}"
    return [
        lambda: ("en", "plain", user(fill("Please pay the deposit to sort code {sc}, account number {acct}, reference FLAT4.",
                                          "en", sc=sc(), acct=digits(8, True))), ["bank-account"]),
        lambda: ("en", "plain", user(fill("Set up direct deposit for me: routing number {rt}, account number {acct}.",
                                          "en", rt=gen_aba(), acct=digits(10, True))), ["bank-account"]),
        lambda: ("en", "dashes", user(fill("My bank details for the refund: sort code {sc}, acct {acct}.",
                                           "en", sc=sc(), acct=digits(8, True))), ["bank-account"]),
        lambda: ("en", "plain", user(fill("Is ABA routing number {rt} a Chase or a Wells Fargo one? My account number is {acct}.",
                                          "en", rt=gen_aba(), acct=digits(9, True))), ["bank-account"]),
        lambda: ("de", "plain", user(fill("Meine Kontonummer ist {acct} bei der Sparkasse, BLZ {blz}. Reicht das für die Überweisung aus den USA?",
                                          "de", acct=digits(10, True), blz=digits(8, True))), ["bank-account"]),
        lambda: ("fr", "plain", user(fill("Mon numéro de compte est {acct} (code banque {bank}, guichet {g}) ; c'est suffisant pour un virement ?",
                                          "fr", acct=digits(11, True), bank=digits(5, True), g=digits(5))), ["bank-account"]),
        lambda: ("es", "plain", user(fill("Mi número de cuenta es {acct}, ¿podéis domiciliar el recibo ahí?",
                                          "es", acct=digits(10, True))), ["bank-account"]),
        lambda: ("zh", "plain", user(fill("我的银行账号是{acct}，开户行是招商银行深圳南山支行，请把报销款打到这里。",
                                          "zh", acct=digits(12, True))), ["bank-account"]),
        lambda: ("zh", "plain", user(fill("对公账户账号：{acct}，户名：杭州示例科技有限公司。帮我写一份付款通知。",
                                          "zh", acct=digits(12, True))), ["bank-account"]),
        lambda: ("hi", "plain", user(fill("मेरा bank account number {acct} है, IFSC कोड SBIN000{ifsc}। पैसे इसमें भेज दीजिए।",
                                          "hi", acct=digits(11, True), ifsc=digits(4, True))), ["bank-account"]),
        lambda: ("en", "json", user(wrap("json", "en", [("name", name("en")), ("routing_number", gen_aba()),
                                                        ("account_number", digits(10, True))])), ["bank-account"]),
        lambda: ("en", "config", user(wrap("config", "en", [("name", name("en")), ("sort_code", sc()),
                                                            ("account_number", digits(8, True))])), ["bank-account"]),
    ]


PHONE_TPL = {
    ("en", "intl-phone"): ["Text me on {v} when the parcel arrives.",
                           "Add {v} as the emergency contact for {name}."],
    ("en", "national-phone"): ["Call me at {v} after 6pm about the quote.",
                               "My phone number is {v}, please update my profile."],
    ("de", "intl-phone"): ["Ruf mich bitte unter {v} an, wenn das Paket da ist."],
    ("de", "national-phone"): ["Meine Telefonnummer: {v} – bitte im Kundenprofil ändern.",
                               "Handy: {v}. Kannst du daraus eine vCard machen?"],
    ("fr", "intl-phone"): ["Vous pouvez me joindre au {v} demain matin."],
    ("fr", "national-phone"): ["Mon téléphone : {v}, rappelez-moi pour le devis."],
    ("es", "intl-phone"): ["Escríbeme por WhatsApp al {v}."],
    ("es", "national-phone"): ["Mi teléfono es {v}, llamadme para confirmar la cita."],
    ("zh", "intl-phone"): ["我的手机号是 {v}，到了请给我打电话。"],
    ("zh", "national-phone"): ["联系电话：{v}，请在工作日拨打。", "手机{v}，收件人{name}，麻烦送货前联系。"],
    ("hi", "intl-phone"): ["मेरा फ़ोन नंबर {v} है, कल सुबह कॉल करें।"],
    ("hi", "national-phone"): ["मेरा mobile नंबर {v} है, डिलीवरी से पहले फ़ोन करें।"],
}
PHONE_PLAN = [("en", "intl-phone"), ("en", "intl-phone"), ("en", "national-phone"),
              ("en", "national-phone"), ("de", "intl-phone"), ("de", "national-phone"),
              ("fr", "intl-phone"), ("fr", "national-phone"), ("es", "intl-phone"),
              ("es", "national-phone"), ("zh", "intl-phone"), ("zh", "national-phone"),
              ("zh", "national-phone"), ("hi", "intl-phone"), ("hi", "national-phone"),
              ("en", "json")]


def phone_item(lang: str, variant: str):
    if variant == "json":
        return user(wrap("json", lang, [("name", name(lang)),
                                        ("phone", gen_phone(lang, "intl-phone"))])), ["phone"]
    tpl = rng.choice(PHONE_TPL[(lang, variant)])
    return user(fill(tpl, lang, v=gen_phone(lang, variant))), ["phone"]


# Famous public addresses are labelled postal-address all the same: the
# label says what the text holds, not whose it is.
LANDMARKS = [
    ("en", "How long does it take to walk from 1600 Pennsylvania Avenue NW, Washington, DC 20500 to the Lincoln Memorial?"),
    ("en", "Can tourists visit 10 Downing Street, London SW1A 2AA, or only see it from the gate?"),
    ("fr", "Combien de temps faut-il pour aller de la gare de Lyon au 5 Avenue Anatole France, 75007 Paris ?"),
]


# --------------------------------------------------------------------------
# Network identifiers.
# --------------------------------------------------------------------------

def ip_items():
    ip, priv = gen_ip, lambda: gen_ip("private")
    return [
        lambda: ("en", "plain", user(f"I can't SSH into {ip()} from home but it works from the office — what should I check?"), ["ip-address"]),
        lambda: ("en", "config", user(f"Does this nginx upstream look right?\n\n```nginx\nupstream api {{\n    server {priv()}:8080;\n    server {priv()}:8080 backup;\n}}\n```"), ["ip-address"]),
        lambda: ("en", "code", user(f"Why does this hang?\n\n```python\nimport socket\ns = socket.create_connection((\"{priv()}\", 5432), timeout=3)\n```"), ["ip-address"]),
        lambda: ("en", "json", user("Explain this event:\n\n```json\n" + json.dumps({"event": "login_failed", "client_ip": ip(), "attempts": 7}, indent=2) + "\n```"), ["ip-address"]),
        lambda: ("en", "plain", user(f"Our firewall blocks {gen_ipv6()} — how do I allow it with ufw?"), ["ip-address"]),
        lambda: ("de", "plain", user(f"Warum ist der Server unter {ip()} seit heute Morgen nicht erreichbar?"), ["ip-address"]),
        lambda: ("fr", "plain", user(f"Mon routeur donne l'adresse {priv()} à l'imprimante ; comment la fixer ?"), ["ip-address"]),
        lambda: ("es", "plain", user(f"¿Por qué mi servidor con IP {ip()} aparece en una lista negra de spam?"), ["ip-address"]),
        lambda: ("zh", "plain", user(f"服务器IP是 {ip()}，为什么 ping 不通？"), ["ip-address"]),
        lambda: ("zh", "config", user(f"```ini\n[mysqld]\nbind-address = {priv()}\nport = 3306\n```\n这样配置对吗？远程连不上。"), ["ip-address"]),
        lambda: ("hi", "plain", user(f"मेरे सर्वर का IP {ip()} है, इस पर SSL certificate कैसे लगाएँ?"), ["ip-address"]),
        lambda: ("en", "plain", user(f"This keeps showing up in auth.log: `Invalid user admin from {ip()} port {rng.randint(30000, 65000)}` — is it an attack?"), ["ip-address"]),
    ]


def mac_items():
    return [
        lambda: ("en", "plain", user(f"My laptop's Wi-Fi MAC address is {gen_mac()}; how do I whitelist it on the router?"), ["mac-address"]),
        lambda: ("en", "dashes", user(f"ipconfig /all shows Physical Address {gen_mac('-', True)} — is that the Ethernet or the Wi-Fi adapter?"), ["mac-address"]),
        lambda: ("en", "config", user(f"Is this dhcpd reservation correct?\n\n```\nhost printer {{\n  hardware ethernet {gen_mac()};\n  fixed-address {gen_ip('private')};\n}}\n```"), ["ip-address", "mac-address"]),
        lambda: ("en", "code", user(f"```python\nALLOWED = {{\"{gen_mac()}\", \"{gen_mac()}\"}}\nif mac.lower() not in ALLOWED:\n    deny()\n```\nHow do I load the allow-list from a file instead?"), ["mac-address"]),
        lambda: ("en", "json", user("Why is this device flagged?\n\n```json\n" + json.dumps({"device": "thermostat-2", "device_mac": gen_mac(), "firmware": "4.2.1"}, indent=2) + "\n```"), ["mac-address"]),
        lambda: ("de", "plain", user(f"Mein Fernseher hat die MAC-Adresse {gen_mac()}, wie sperre ich ihn in der Fritzbox?"), ["mac-address"]),
        lambda: ("fr", "dashes", user(f"L'adresse MAC de ma console est {gen_mac('-', True)} ; comment la réserver sur la box ?"), ["mac-address"]),
        lambda: ("es", "plain", user(f"¿Cómo bloqueo en el router el dispositivo con MAC {gen_mac()}?"), ["mac-address"]),
        lambda: ("zh", "plain", user(f"我电脑的MAC地址是 {gen_mac(':', True)}，怎么在路由器里绑定？"), ["mac-address"]),
        lambda: ("zh", "config", user(f"```\nnmcli connection modify eth0 802-3-ethernet.cloned-mac-address {gen_mac()}\n```\n这条命令有什么作用？"), ["mac-address"]),
        lambda: ("hi", "plain", user(f"मेरे फ़ोन का MAC address {gen_mac()} है, इसे Wi-Fi पर block कैसे करें?"), ["mac-address"]),
        lambda: ("en", "plain", user(f"`wakeonlan {gen_mac()}` does nothing — what settings does the NIC need?"), ["mac-address"]),
    ]


# --------------------------------------------------------------------------
# Secrets.
# --------------------------------------------------------------------------

def api_key_items():
    return [
        lambda: ("en", "config", user("boto3 says the request signature doesn't match. This is ~/.aws/credentials:\n\n```ini\n[default]\n"
                                      f"aws_access_key_id = {aws_key_id()}\naws_secret_access_key = {aws_secret()}\nregion = eu-west-1\n```"),
                 ["api-key", "secret"]),
        lambda: ("en", "plain", user(f"I accidentally pasted {gh_classic()} into a public issue. How do I revoke it and check what it accessed?"), ["api-key"]),
        lambda: ("de", "code", user("Warum bekomme ich 401 von der GitHub-API?\n\n```python\nheaders = {\"Authorization\": \"Bearer "
                                    f"{gh_fine()}\", \"Accept\": \"application/vnd.github+json\"}}\n```"), ["api-key"]),
        lambda: ("fr", "plain", user(f"La commande `git clone https://oauth2:{glpat()}@gitlab.example.com/equipe/app.git` échoue avec 403, pourquoi ?"),
                 ["api-key", "password"]),
        lambda: ("es", "code", user("¿Por qué falla este bot de Slack?\n\n```python\nfrom slack_sdk import WebClient\n"
                                    f"client = WebClient(token=\"{slack_bot()}\")\nclient.chat_postMessage(channel=\"#general\", text=\"hola\")\n```"),
                 ["api-key", "secret"]),
        lambda: ("zh", "plain", user(f"这个Slack用户令牌 {slack_user()} 有哪些权限？怎么缩小范围？"), ["api-key"]),
        lambda: ("en", "code", user(f"```python\nimport stripe\nstripe.api_key = \"{stripe('sk_live_')}\"\nstripe.Refund.create(charge=\"ch_3Nx\")\n```\nWhy do refunds fail with 'No such charge'?"),
                 ["api-key", "secret"]),
        lambda: ("hi", "plain", user(f"Stripe की restricted key {stripe('rk_live_')} से payouts क्यों नहीं दिख रहे?"), ["api-key"]),
        lambda: ("en", "config", user(f"My .env:\n\n```\nOPENAI_API_KEY={openai_key()}\nMODEL=gpt-4o-mini\n```\nThe client says the key is invalid — is the format right?"),
                 ["api-key", "secret"]),
        lambda: ("en", "plain", user(f"curl https://api.anthropic.com/v1/messages -H \"x-api-key: {anthropic_key()}\" returns 401. What's wrong?"), ["api-key"]),
        lambda: ("de", "json", user("Die Karte lädt nicht:\n\n```json\n" + json.dumps({"mapsApiKey": google_key(), "region": "DE"}, indent=2) + "\n```"),
                 ["api-key", "secret"]),
        lambda: ("fr", "plain", user(f"Ma clé API Twilio {twilio_key()} ne marche plus depuis hier, faut-il la régénérer ?"), ["api-key"]),
        lambda: ("es", "plain", user(f"Los correos no salen con la clave de SendGrid {sendgrid_key()}; ¿qué permisos necesita?"), ["api-key"]),
        lambda: ("en", "config", user(f"Why can't my function read the blob container?\n\n```\nAzureWebJobsStorage=\"{azure_conn()}\"\n```"), ["api-key"]),
        lambda: ("zh", "config", user(f"`.npmrc` 里这样写对吗？\n\n```\n//registry.npmjs.org/:_authToken={npm_token()}\n```\n发布时还是提示 401。"),
                 ["api-key", "secret"]),
        lambda: ("en", "code", user(f"```bash\nhuggingface-cli login --token {hf_token()}\n```\nIt says the token is invalid. Any idea?"), ["api-key"]),
        lambda: ("en", "zero-width", user("Is this AWS key ID still active? " + (lambda k: k[:10] + ZWSP + k[10:])(aws_key_id())), ["api-key"]),
    ]


def private_key_items():
    intros = {
        "en": "ssh keeps saying 'invalid format' for this key:",
        "de": "ssh meldet 'invalid format' für diesen Schlüssel:",
        "fr": "ssh refuse cette clé avec « invalid format » :",
        "es": "ssh dice 'invalid format' con esta clave:",
        "zh": "ssh 一直提示这个密钥格式无效：",
        "hi": "ssh इस key को 'invalid format' बता रहा है:",
    }
    items = []
    plan = [("en", "plain", 0), ("en", "plain", 3), ("en", "code", 1), ("en", "json", 1),
            ("en", "config", 2), ("de", "code", 3), ("fr", "plain", 0), ("es", "code", 4),
            ("zh", "plain", 3), ("zh", "code", 0), ("hi", "plain", 2), ("en", "plain", 4)]
    for lang, variant, which in plan:
        def make(lang=lang, variant=variant, which=which):
            pem = gen_pem(which)
            if variant == "json":
                body = json.dumps({"type": "service_account", "project_id": f"demo-project-{rng.randint(10000, 99999)}",
                                   "private_key": pem + "\n"}, indent=2)
                text = "Is this service-account file complete?\n\n```json\n" + body + "\n```"
            elif variant == "config":
                text = ("Ansible can't connect with this vars file:\n\n```yaml\ndeploy_user: ubuntu\nssh_key: |\n"
                        + "\n".join("  " + ln for ln in pem.split("\n")) + "\n```")
            elif variant == "code":
                text = f"{intros[lang]}\n\n```\n{pem}\n```"
            else:
                text = f"{intros[lang]}\n\n{pem}"
            return lang, variant, user(text), ["private-key"]
        items.append(make)
    return items


def jwt_items():
    return [
        lambda: ("en", "plain", user(f"Why does this request return 401?\n\nAuthorization: Bearer {gen_jwt()}"), ["jwt"]),
        lambda: ("en", "code", user(f"```bash\ncurl -s https://api.example.com/v2/orders -H \"Authorization: Bearer {gen_jwt('RS256')}\"\n```\nIt worked yesterday. What changed?"), ["jwt"]),
        lambda: ("en", "plain", user(f"Decode this JWT and tell me when it expires: {gen_jwt()}"), ["jwt"]),
        lambda: ("en", "json", user("The SPA can't log in with this response:\n\n```json\n" + json.dumps({"id_token": gen_jwt('RS256'), "expires_in": 3600}, indent=2) + "\n```"),
                 ["jwt", "secret"]),
        lambda: ("de", "plain", user(f"Kannst du dieses JWT dekodieren und mir die Rollen nennen? {gen_jwt()}"), ["jwt"]),
        lambda: ("fr", "plain", user(f"Pourquoi ce jeton est-il refusé ? {gen_jwt()}"), ["jwt"]),
        lambda: ("es", "plain", user(f"¿Qué contiene este JWT? {gen_jwt()}"), ["jwt"]),
        lambda: ("zh", "plain", user(f"帮我解析这个JWT，看看过期时间：{gen_jwt()}"), ["jwt"]),
        lambda: ("zh", "code", user(f"```js\nfetch('/api/me', {{ headers: {{ Authorization: 'Bearer {gen_jwt()}' }} }})\n```\n为什么返回403？"), ["jwt"]),
        lambda: ("hi", "plain", user(f"यह JWT valid है या नहीं? {gen_jwt()}"), ["jwt"]),
        lambda: ("en", "plain", user(f"The browser sends `Cookie: session={gen_jwt()}` but the server logs me out. Why?"), ["jwt"]),
        lambda: ("en", "code", user(f"```python\nr = requests.get(url, headers={{\"Authorization\": \"Bearer {gen_jwt('RS256')}\"}})\n```\nHow do I refresh this automatically?"), ["jwt"]),
    ]


def password_items():
    pw = gen_password
    return [
        lambda: ("en", "plain", user(f"My app can't connect with postgres://orders_app:{pw()}@db.internal.example.com:5432/orders — what's wrong?"), ["password"]),
        lambda: ("en", "config", user(f"```\nMONGO_URL=mongodb+srv://analytics:{pw()}@cluster0.example.mongodb.net/prod?retryWrites=true\n```\nWhy does it time out?"), ["password"]),
        lambda: ("en", "plain", user(f"Is this connection string right? Server=tcp:sql01.example.net,1433;Database=Sales;User Id=app_rw;Password={pw()};Encrypt=true;"), ["password"]),
        lambda: ("en", "config", user(f"```toml\n[database]\nhost = \"db.example.internal\"\nuser = \"billing\"\npassword = \"{pw()}\"\n```\nHow do I load this with serde?"), ["password"]),
        lambda: ("en", "config", user(f"```yaml\nservices:\n  db:\n    image: postgres:16\n    environment:\n      - POSTGRES_PASSWORD={pw()}\n```\nThe container exits immediately. Why?"), ["password"]),
        lambda: ("de", "plain", user(f"Mein Router-Login ist admin, Passwort: {pw()} – wie ändere ich das WLAN-Band?"), ["password"]),
        lambda: ("fr", "plain", user(f"Le compte partagé de l'équipe : identifiant compta, mot de passe : {pw()}. Comment activer la double authentification ?"), ["password"]),
        lambda: ("es", "plain", user(f"El usuario es soporte y la contraseña: {pw()}. ¿Cómo la cambio desde la consola?"), ["password"]),
        lambda: ("zh", "plain", user(f"数据库账号 root，密码：{pw()}，为什么远程登录被拒绝？"), ["password"]),
        lambda: ("hi", "plain", user(f"मेरा email login है और password: {pw()} — इसे कैसे बदलूँ?"), ["password"]),
        lambda: ("en", "json", user("Why does the login endpoint return 400?\n\n```json\n" + json.dumps({"username": "svc-report", "password": pw()}, indent=2) + "\n```"), ["password"]),
        lambda: ("en", "plain", user(f"Celery can't reach redis://default:{pw()}@cache.example.internal:6379/0 — how do I debug this?"), ["password"]),
        lambda: ("es", "plain", user(f"¿Por qué falla la descarga de ftp://backup:{pw()}@ftp.example.com/2024/ ?"), ["password"]),
        lambda: ("zh", "code", user(f"```python\nconn = pymysql.connect(host=\"db.example.internal\", user=\"report\", password=\"{pw()}\")\n```\n这样写有什么安全问题？"), ["password"]),
    ]


def secret_items():
    return [
        lambda: ("en", "config", user(f"```\nJWT_SECRET={mixed(48)}\nJWT_TTL=3600\n```\nIs 48 characters long enough for HS256?"), ["secret"]),
        lambda: ("en", "config", user(f"```yaml\noauth:\n  client_id: {rstr(24, HEX)}\n  client_secret: {mixed(40, B64URL)}\n```\nWhy does the token endpoint say invalid_client?"), ["secret"]),
        lambda: ("en", "code", user(f"```python\n# settings.py\nSECRET_KEY = \"{mixed(50, ALNUM + '!#%^&*(-_=+)')}\"\nDEBUG = False\n```\nIs it OK to keep this in the repo?"), ["secret"]),
        lambda: ("en", "json", user("Our mobile app stores this after login:\n\n```json\n" + json.dumps({"refresh_token": mixed(64, B64URL), "scope": "offline_access"}, indent=2) + "\n```\nWhere should it be kept?"), ["secret"]),
        lambda: ("en", "plain", user(f"The proxy forwards X-Auth-Token: {mixed(32)} to the backend. Is that a problem?"), ["secret"]),
        lambda: ("de", "config", user(f"```\nAPI_KEY={mixed(32)}\nBASE_URL=https://api.example.com\n```\nWarum bekomme ich trotzdem 403?"), ["secret"]),
        lambda: ("fr", "config", user(f"```yaml\nstripe:\n  webhook_secret: whsec_{mixed(32)}\n```\nLa signature du webhook ne correspond jamais, pourquoi ?"), ["secret"]),
        lambda: ("es", "code", user(f"```js\nconst accessToken = \"{mixed(40)}\";\nfetch(url, {{ headers: {{ Authorization: `Bearer ${{accessToken}}` }} }});\n```\n¿Por qué devuelve 401?"), ["secret"]),
        lambda: ("zh", "config", user(f"```yaml\nwechat:\n  app_id: wx{rstr(16, HEX)}\n  app_secret: {mixed(32)}\n```\n获取access_token一直报错40125。"), ["secret"]),
        lambda: ("hi", "config", user(f"```\nSESSION_SECRET={mixed(40)}\n```\nक्या यह production के लिए काफ़ी सुरक्षित है?"), ["secret"]),
        lambda: ("en", "code", user(f"```hcl\nvariable \"db_credentials\" {{\n  default = \"{mixed(44, B64)}\"\n}}\n```\nShould this be a sensitive variable instead?"), ["secret"]),
        lambda: ("en", "config", user(f"```yaml\napiVersion: v1\nkind: Secret\nstringData:\n  encryption_secret: {mixed(44, B64)}\n```\nWhy does kubectl apply reject this?"), ["secret"]),
        lambda: ("zh", "config", user(f"```\naccess_key_id: LTAI{mixed(20)}\naccess_key_secret: {mixed(30)}\n```\n阿里云OSS上传时报 SignatureDoesNotMatch，怎么排查？"), ["secret"]),
    ]


# --------------------------------------------------------------------------
# Confidential prose (no identifier needed).
# --------------------------------------------------------------------------

CONFIDENTIAL = [
    ("en", "CONFIDENTIAL — do not forward. Draft talking points for Thursday's all-hands explaining the 12% cut in the London office headcount."),
    ("en", "I was diagnosed with bipolar disorder last month and my manager doesn't know yet. How do I ask for adjustments at work without disclosing the diagnosis?"),
    ("en", "We're planning to acquire Northwind Analytics for about $340M; the deal is unannounced. Write a one-page memo for the board on integration risks."),
    ("en", "My base salary is £68,000 and they offered me a 15% retention bonus to stay another year. Is that a good package?"),
    ("en", "Internal only: summarise the notes from the settlement talks with our former distributor — they want $2.1M to drop the lawsuit."),
    ("en", "Our CFO wants a shortlist of teams for the layoffs next quarter. Help me set criteria that will hold up if anyone sues."),
    ("en", "My wife's biopsy came back positive for breast cancer and she starts chemotherapy in two weeks. How do we tell our kids?"),
    ("en", "Privileged and confidential: outline our litigation strategy for the patent dispute with Halden Robotics before the hearing."),
    ("en", "Dana's performance review was poor and HR wants a disciplinary plan by Friday. Draft the improvement plan and the warning letter."),
    ("en", "Before the announcement on Monday, draft an employee FAQ about our merger with Crestline Logistics. Nobody outside the exec team knows yet."),
    ("en", "I'm pregnant and haven't told my employer yet — can they end my contract during probation?"),
    ("de", "Vertraulich: Bitte fasse die Gehaltsanpassungen für das Vertriebsteam 2025 in einer Tabelle zusammen."),
    ("de", "Bei mir wurde eine Depression diagnostiziert und ich möchte es meinem Arbeitgeber nicht sagen. Muss ich die Krankheit angeben?"),
    ("de", "Streng geheim: Die Übernahme der Müller Logistik GmbH wird erst im Juni bekanntgegeben. Entwirf eine interne Kommunikationsstrategie."),
    ("de", "Ein ehemaliger Mitarbeiter hat Klage eingereicht; der Vergleich soll bei 180.000 Euro liegen. Wie formuliere ich die Information an den Vorstand?"),
    ("fr", "Confidentiel : prépare une note sur le plan de licenciements prévu au deuxième trimestre pour le site de Lille."),
    ("fr", "Mon salaire actuel est de 52 000 € brut et on me propose une prime de 8 000 € pour rester. Est-ce que je négocie ?"),
    ("fr", "On m'a diagnostiqué un diabète de type 1 et je ne veux pas que mon employeur le sache. Quels sont mes droits ?"),
    ("fr", "Document à usage interne : résume les conditions de la fusion avec Atelier Moreau avant l'annonce officielle."),
    ("es", "Confidencial: redacta un correo a los accionistas sobre la adquisición de Solaris Energía antes del anuncio público."),
    ("es", "Mi sueldo es de 38.000 euros y mi jefe me ofreció un bonus del 10 %. ¿Es justo para un ingeniero con cinco años de experiencia?"),
    ("es", "A mi padre le diagnosticaron cáncer de páncreas; ¿cómo le explico a mi jefe que necesito reducir la jornada?"),
    ("es", "Uso interno: resume la demanda que presentó el antiguo proveedor y la cantidad que pide para llegar a un acuerdo."),
    ("zh", "机密：请帮我起草一份关于第三季度裁员计划的内部通知，不要对外公开。"),
    ("zh", "我去年年薪是45万，今年公司说要降薪20%，我该怎么和HR谈？"),
    ("zh", "我妈妈上周确诊了乳腺癌，医生建议化疗，我该怎么向公司请长假？"),
    ("zh", "保密文件：公司计划收购深圳一家芯片设计公司，消息尚未公开，请帮我写一份董事会汇报提纲。"),
    ("zh", "仅限内部：总结一下我们和前供应商的诉讼进展以及可能的和解金额。"),
    ("hi", "गोपनीय (confidential): अगले महीने होने वाली छंटनी (layoffs) की सूची तैयार करने में मदद करें।"),
    ("hi", "मेरी salary 18 लाख है और कंपनी इस साल bonus नहीं दे रही — क्या मुझे नौकरी बदलनी चाहिए?"),
    ("hi", "डॉक्टर ने मुझे डायबिटीज़ diagnose किया है, क्या मुझे ऑफिस में बताना ज़रूरी है?"),
]


# --------------------------------------------------------------------------
# Prompts with several kinds.
# --------------------------------------------------------------------------

def multi_items():
    def sc():
        return f"{rng.randint(10, 99)}-{digits(2)}-{digits(2)}"
    return [
        lambda: ("en", "plain", user(f"Create a CRM entry for this new customer:\nName: {name('en')}\nEmail: {gen_email('en')}\n"
                                     f"Phone: {gen_phone('en', 'intl-phone')}\nAddress: {gen_address('en')}\nDOB: {gen_dob('en')}"),
                 ["email", "phone", "postal-address", "date-of-birth"]),
        lambda: ("en", "plain", user(f"Internal only — pay change for {name('en')}: new salary £{rng.randint(40, 95)},000 from next month. "
                                     f"NI number {render('uk-nino', gen_nino(), 'spaces')}, paid into sort code {sc()}, account number {digits(8, True)}."),
                 ["uk-nino", "bank-account", "confidential"]),
        lambda: ("en", "plain", user(f"Summarise for the handover: patient {name('en')}, NHS number {render('nhs-number', gen_nhs(), 'spaces')}, "
                                     f"date of birth {gen_dob('en')}. Diagnosed with type 2 diabetes last week, prescribed metformin."),
                 ["nhs-number", "date-of-birth", "confidential"]),
        lambda: ("en", "config", user(f"Why does the app crash on start?\n\n```\nAWS_ACCESS_KEY_ID={aws_key_id()}\nAWS_SECRET_ACCESS_KEY={aws_secret()}\n"
                                      f"DATABASE_URL=postgres://web:{gen_password()}@db.example.internal:5432/shop\nJWT_SECRET={mixed(40)}\n```"),
                 ["api-key", "password", "secret"]),
        lambda: ("de", "plain", user(f"Bitte erstelle eine Rechnung an: Brandt Elektro GmbH, {gen_address('de')}, USt-IdNr. {vat_de()}. "
                                     f"Zahlung auf IBAN {render('iban', gen_iban('de'), 'spaces')}."),
                 ["iban", "eu-vat", "postal-address"]),
        lambda: ("fr", "plain", user(f"Nouveau client : {name('fr')}, e-mail {gen_email('fr')}, téléphone {gen_phone('fr', 'intl-phone')}, "
                                     f"IBAN {render('iban', gen_iban('fr'), 'spaces')}. Peux-tu préparer le mandat SEPA ?"),
                 ["email", "iban", "phone"]),
        lambda: ("es", "plain", user(f"Para la reserva: {name('es')}, pasaporte {gen_passport('es')}, fecha de nacimiento {gen_dob('es')}, "
                                     f"correo {gen_email('es')}."),
                 ["email", "passport", "date-of-birth"]),
        lambda: ("zh", "plain", user(f"快递信息：收件人{name('zh')}，身份证号{gen_cn()}，电话{gen_phone('zh', 'national-phone')}，地址{gen_address('zh')}。"),
                 ["cn-resident-id", "phone", "postal-address"]),
        lambda: ("zh", "plain", user(f"机密：{name('zh')}的年薪调整为48万，工资发到银行账号{digits(12, True)}。请不要外传。"),
                 ["bank-account", "confidential"]),
        lambda: ("hi", "plain", user(f"KYC के लिए: नाम {name('hi')}, आधार {render('in-aadhaar', gen_aadhaar(), 'spaces')}, "
                                     f"मोबाइल {gen_phone('hi', 'intl-phone')}, ईमेल {gen_email('hi')}।"),
                 ["email", "in-aadhaar", "phone"]),
        lambda: ("en", "code", user(f"These lines keep appearing in the access log:\n\n```\n{gen_ip()} - - [12/Mar/2024:10:21:07 +0000] "
                                    f"\"POST /login HTTP/1.1\" 401 user={gen_email('en')} mac={gen_mac()}\n```\nIs someone brute-forcing us?"),
                 ["email", "ip-address", "mac-address"]),
        lambda: ("en", "plain", user(f"Order for {name('en')}: card {render('payment-card', gen_card(), 'spaces')}, exp 04/27, "
                                     f"ship to {gen_address('en')}, receipt to {gen_email('en')}."),
                 ["email", "payment-card", "postal-address"]),
        lambda: ("en", "json", user("Validate this onboarding record:\n\n```json\n" + json.dumps(
            {"name": name("en"), "ssn": render("us-ssn", gen_ssn(), "dashes"), "date_of_birth": gen_dob("en", iso=True),
             "routing_number": gen_aba(), "account_number": digits(10, True)}, indent=2) + "\n```"),
            ["us-ssn", "bank-account", "date-of-birth"]),
        lambda: ("en", "code", user(f"The deploy step fails:\n\n```\nssh -i deploy.pem ubuntu@{gen_ip()}\n```\n\ndeploy.pem is:\n\n{gen_pem(2)}"),
                 ["ip-address", "private-key"]),
        lambda: ("en", "plain", user(f"CONFIDENTIAL: forward the draft term sheet for our acquisition of Bluewater Health to {gen_email('en')} before Friday."),
                 ["email", "confidential"]),
        lambda: ("de", "plain", user(f"Vertraulich: Die Abfindung für {name('de')} beträgt 45.000 €. Bitte auf IBAN {render('iban', gen_iban('de'), 'spaces')} überweisen."),
                 ["iban", "confidential"]),
        lambda: ("en", "code", user(f"```bash\ncurl -H 'Authorization: Bearer {gen_jwt()}' http://{gen_ip('private')}:8080/api/v1/me\n```\nreturns 403 — why?"),
                 ["ip-address", "jwt"]),
        lambda: ("fr", "plain", user(f"Confidentiel : appelle {name('fr')} au téléphone {gen_phone('fr', 'national-phone')} pour lui annoncer son licenciement avant vendredi."),
                 ["phone", "confidential"]),
        lambda: ("en", "config", user(f"```yaml\nservices:\n  ci:\n    image: runner:latest\n    command: git clone https://oauth2:{glpat()}@gitlab.example.com/acme/app.git\n"
                                      f"    environment:\n      POSTGRES_PASSWORD: {gen_password()}\n```\nThe clone step hangs. Why?"),
                 ["api-key", "password"]),
        lambda: ("zh", "plain", user(f"签证材料：护照号码{gen_passport('zh')}，出生日期{gen_dob('zh')}，请帮我核对。"),
                 ["passport", "date-of-birth"]),
        lambda: ("es", "plain", user(f"Pagué con la tarjeta {render('payment-card', gen_card(), 'spaces')} y me cobraron dos veces; mi teléfono es {gen_phone('es', 'national-phone')}."),
                 ["payment-card", "phone"]),
        lambda: ("en", "plain", user(f"Draft a settlement letter for the lawsuit brought by {name('en')} (SSN {render('us-ssn', gen_ssn(), 'dashes')}); "
                                     f"we agreed to pay $85,000. Keep it confidential."),
                 ["us-ssn", "confidential"]),
        lambda: ("hi", "plain", user(f"गोपनीय: {name('hi')} की salary 14 लाख से बढ़ाकर 17 लाख कर दें, bank account number {digits(11, True)} में भेजें।"),
                 ["bank-account", "confidential"]),
        lambda: ("zh", "plain", user(f"用户 {gen_email('zh')} 从 IP {gen_ip()} 多次登录失败，帮我写一条告警规则。"),
                 ["email", "ip-address"]),
    ]


# --------------------------------------------------------------------------
# Clean prompts (nothing sensitive), many of them near misses.
# --------------------------------------------------------------------------

def luhn_fail(n: int) -> str:
    body = digits(n - 1, True)
    good = int(luhn_digit(body))
    return body + str((good + rng.randint(1, 9)) % 10)


def order_no() -> str:
    d = luhn_fail(16)
    return " ".join(d[i:i + 4] for i in range(0, 16, 4))


def tracking_no() -> str:
    d = "9400" + digits(18)
    return " ".join(d[i:i + 4] for i in range(0, 22, 4))


def isbn() -> str:
    g = rng.choice(["0", "1", "3"])
    pub = digits(rng.randint(2, 4), True)
    title = digits(8 - len(pub))
    body = "978" + g + pub + title
    return f"978-{g}-{pub}-{title}-{isbn13_digit(body)}"


def a_uuid() -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def git_hash() -> str:
    return f"{rng.getrandbits(160):040x}"


def big_number() -> str:
    return luhn_fail(rng.randint(13, 15))


N, P, C = "near-miss", "plain", "code"

CLEAN_STATIC = [
    ("en", P, "What are the symptoms of flu, and when should someone see a doctor?"),
    ("en", P, "Give me a recipe for a vegetarian lasagna that serves six."),
    ("en", P, "What's the best time of year to visit Kyoto for the autumn colours?"),
    ("en", N, "Explain confidential computing and how AMD SEV-SNP differs from Intel TDX."),
    ("en", P, "Summarise the plot of Pride and Prejudice in three sentences."),
    ("en", N, "Marie Curie was born in 1867 in Warsaw — what were her main scientific discoveries?"),
    ("en", P, "How do I reverse a singly linked list in Rust without unsafe code?"),
    ("en", P, "What's the difference between TCP and UDP, with an example of when to use each?"),
    ("en", P, "Write a haiku about the sea in winter."),
    ("en", P, "How many grams of protein are in 100 g of cooked lentils?"),
    ("en", P, "Is it safe to take ibuprofen and paracetamol together?"),
    ("en", P, "Why is Canberra the capital of Australia instead of Sydney?"),
    ("en", P, "Translate 'Where is the train station?' into Japanese and Korean."),
    ("en", N, "Explain how a JSON Web Token is structured (header, payload, signature) without using a real token."),
    ("en", N, "Why do AWS access key IDs start with AKIA, and what do other prefixes like ASIA mean?"),
    ("en", N, "What is password spraying and how do lockout policies defend against it?"),
    ("en", N, "What's the safest way to store API keys in a mobile app?"),
    ("en", N, "Our team's secret to short stand-ups is a strict 10-minute timer — any other tips?"),
    ("en", N, "How do people usually research typical salaries for a job title before an interview?"),
    ("en", N, "In general, how do mergers and acquisitions affect a company's share price?"),
    ("en", N, "Explain how the Luhn checksum works, step by step."),
    ("en", P, "What's the tallest mountain in Africa and how long does the climb take?"),
    ("en", P, "Plan a three-day itinerary for Lisbon on a tight budget."),
    ("en", N, "How long does a UK passport renewal take at the moment?"),
    ("en", N, "What is the standard VAT rate in Germany and in France?"),
    ("en", P, "How do I format a datetime as ISO 8601 in Python?"),
    ("en", P, "Who won the 2018 FIFA World Cup and who was the top scorer?"),
    ("en", P, "What were the main causes of the First World War?"),
    ("en", P, "How do I calculate compound interest with monthly contributions?"),
    ("en", P, "Suggest ten names for a golden retriever puppy."),
    ("en", N, "What does an IBAN look like, and why does it start with a country code?"),
    ("en", N, "What is the Aadhaar card used for in India?"),
    ("en", N, "How is an NHS number different from a National Insurance number?"),
    ("en", N, "Schedule a reminder for 14 March 2025 at 09:00 to renew the domain."),
    ("en", N, "The conference runs from 2024-09-16 to 2024-09-19 — how many working days is that?"),
    ("en", N, "What does the subnet mask 255.255.255.0 mean in CIDR notation?"),
    ("en", N, "Upgrading from v2.14.3 to v3.0.0-rc.1 broke our build — what does the semver jump imply?"),
    ("en", N, "Chrome 120.0.6099.109 vs 121.0.6167.85: which one fixed the WebGPU crash?"),
    ("en", N, "Why is 2^64 equal to 18446744073709551616, and how does that relate to u64::MAX?"),
    ("en", C, "```python\ndef count_tokens(text: str) -> int:\n    token_count = len(text.split())\n    return token_count\n```\nDoes this handle punctuation properly?"),
    ("en", C, "```python\npassword_field_label = _(\"Password\")\nconfirm_password_label = _(\"Confirm password\")\n```\nHow do I mark these strings for translation in Django?"),
    ("en", C, "```yaml\nenv:\n  - name: DB_PASSWORD\n    valueFrom:\n      secretKeyRef:\n        name: db-credentials\n        key: password\n```\nIs this the right way to reference a Kubernetes secret?"),
    ("en", C, "```bash\nexport GITHUB_TOKEN=\"$(gh auth token)\"\n```\nIs it safe to do this in a CI job?"),
    ("en", C, "```ini\n[database]\nuser = app\npassword = ${DB_PASSWORD}\n```\nHow do I make configparser expand the environment variable?"),
    ("en", C, ".env.example:\n```\nOPENAI_API_KEY=<your-key-here>\nDATABASE_URL=postgres://user:password@localhost:5432/app\n```\nShould I commit this file?"),
    ("en", C, "```sql\nSELECT id, email FROM users WHERE password_reset_at IS NOT NULL;\n```\nHow do I add an index for this query?"),
    ("en", N, "What's the difference between a MAC address and an IP address?"),
    ("en", N, "How do I generate an ed25519 SSH key pair, and where is the private key stored?"),
    ("en", P, "Recommend three sci-fi novels for someone who loved The Martian."),
    ("en", P, "How do I make a sourdough starter from scratch?"),
    ("de", P, "Wie koche ich einen klassischen Kartoffelsalat nach schwäbischer Art?"),
    ("de", P, "Was sind typische Symptome einer Erkältung im Vergleich zur Grippe?"),
    ("de", P, "Welche Sehenswürdigkeiten lohnen sich in Dresden an einem Wochenende?"),
    ("de", P, "Erkläre den Unterschied zwischen Rust und Go für Backend-Dienste."),
    ("de", N, "Goethe wurde 1749 in Frankfurt geboren – welche Werke sollte man zuerst lesen?"),
    ("de", N, "Wie hoch ist die Mehrwertsteuer in Österreich?"),
    ("de", N, "Wie ist eine IBAN aufgebaut und wofür steht die Prüfziffer?"),
    ("de", N, "Was ist Confidential Computing und wofür braucht man es in der Cloud?"),
    ("de", N, "Wie lange dauert es, einen neuen Reisepass zu beantragen?"),
    ("fr", P, "Quelle est la recette de la tarte Tatin ?"),
    ("fr", P, "Que visiter à Lyon en deux jours ?"),
    ("fr", P, "Quels sont les symptômes de la grippe chez l'adulte ?"),
    ("fr", P, "Explique la différence entre une liste et un tuple en Python."),
    ("fr", N, "Victor Hugo est né en 1802 : quelles sont ses œuvres majeures ?"),
    ("fr", N, "La version 4.18.2 d'Express est-elle compatible avec Node 20 ?"),
    ("fr", N, "Comment fonctionne la clé de contrôle d'un IBAN ?"),
    ("fr", N, "Qu'est-ce que le confidential computing et à quoi sert-il ?"),
    ("fr", N, "Combien coûte un passeport en France ?"),
    ("es", P, "¿Cómo preparo una paella valenciana auténtica?"),
    ("es", P, "¿Qué ver en Sevilla en un fin de semana?"),
    ("es", P, "¿Cuáles son los síntomas de la gripe y cuánto duran?"),
    ("es", P, "Explícame qué es una API REST con un ejemplo."),
    ("es", N, "Cervantes nació en 1547; ¿qué obras escribió además del Quijote?"),
    ("es", P, "¿Cuánto es 2 elevado a 40?"),
    ("es", N, "¿Qué tipo de IVA se aplica a los libros en España?"),
    ("es", P, "¿Cómo se genera un UUID en JavaScript?"),
    ("es", N, "¿Cuánto tarda en renovarse el pasaporte español?"),
    ("zh", P, "红烧肉怎么做才不腻？"),
    ("zh", P, "去成都旅游三天怎么安排？"),
    ("zh", P, "流感有哪些常见症状？"),
    ("zh", P, "用Python写一个快速排序。"),
    ("zh", N, "鲁迅出生于1881年，他的代表作有哪些？"),
    ("zh", N, "机密计算（Confidential Computing）是什么技术？"),
    ("zh", N, "增值税的税率一般是多少？"),
    ("zh", N, "办理护照需要多长时间？"),
    ("zh", P, "长城有多长？"),
    ("zh", P, "推荐几本科幻小说。"),
    ("zh", P, "如何在Git里撤销上一次提交？"),
    ("zh", N, "版本号 v2.14.3 和 v2.15.0 有什么区别？"),
    ("zh", N, "身份证号码的最后一位为什么会是X？"),
    ("hi", P, "दाल मखनी कैसे बनाते हैं?"),
    ("hi", P, "जयपुर में घूमने की अच्छी जगहें कौन सी हैं?"),
    ("hi", P, "बुखार और सर्दी के सामान्य लक्षण क्या हैं?"),
    ("hi", P, "Python में list comprehension समझाइए।"),
    ("hi", N, "महात्मा गांधी का जन्म 1869 में हुआ था — उनके प्रमुख आंदोलन कौन से थे?"),
    ("hi", N, "आधार कार्ड में पता कैसे अपडेट करें?"),
    ("hi", N, "पासपोर्ट बनवाने में कितना समय लगता है?"),
    ("hi", P, "ताजमहल किसने और कब बनवाया?"),
]

# A clean prompt may hold a dotted quad only where it is not an address.
CLEAN_ALLOW_IP = {"255.255.255.0"}


def clean_generated():
    return [
        lambda: ("en", N, f"My order #{order_no()} still says 'processing' after five days — should I contact support?"),
        lambda: ("en", N, f"Tracking number {tracking_no()} hasn't updated since Monday. What does 'in transit' usually mean?"),
        lambda: ("en", C, f"Why does `SELECT * FROM orders WHERE id = '{a_uuid()}'` return no rows when the record exists?"),
        lambda: ("en", N, (lambda h: f"What changed in commit {h}? `git show {h[:7]}` says the object is missing.")(git_hash())),
        lambda: ("en", N, f"Is ISBN {isbn()} the paperback or the hardcover edition?"),
        lambda: ("en", N, f"Is {big_number()} a prime number? Show the method."),
        lambda: ("en", N, f"Amazon order {rng.randint(111, 114)}-{digits(7)}-{digits(7)} arrived damaged. How do I start a return?"),
        lambda: ("en", N, f"Multiply {digits(9, True)} by {digits(9, True)} and explain long multiplication."),
        lambda: ("en", N, f"Invoice INV-2024-{digits(6)} is for 1,240.50 EUR plus 19% VAT. What's the gross amount?"),
        lambda: ("en", N, f"Flight LH{rng.randint(100, 999)} leaves Frankfurt at 07:45 on 2025-04-12 — which terminal is it?"),
        lambda: ("de", N, f"Meine Bestellnummer ist {order_no()} – wann kommt das Paket?"),
        lambda: ("de", C, f"Warum findet `SELECT * FROM kunden WHERE id = '{a_uuid()}'` nichts?"),
        lambda: ("de", N, f"Was ist neu in Version v{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)} von Django?"),
        lambda: ("fr", N, f"Mon numéro de commande {order_no()} n'est toujours pas arrivé, que faire ?"),
        lambda: ("fr", N, f"Le colis {tracking_no()} est bloqué en douane depuis une semaine."),
        lambda: ("fr", N, f"Est-ce que {big_number()} est divisible par 7 ?"),
        lambda: ("es", N, f"Mi número de pedido {order_no()} no aparece en la web, ¿qué hago?"),
        lambda: ("es", N, f"¿Qué cambió en el commit {git_hash()}?"),
        lambda: ("es", N, f"¿El ISBN {isbn()} corresponde a la edición de bolsillo?"),
        lambda: ("zh", N, f"订单号{order_no()}什么时候发货？"),
        lambda: ("zh", N, f"计算{big_number()}的质因数分解。"),
        lambda: ("zh", C, f"UUID {a_uuid()} 在数据库里查不到是什么原因？"),
        lambda: ("zh", N, f"提交 {git_hash()} 改了哪些文件？怎么查看？"),
        lambda: ("zh", N, f"ISBN {isbn()} 是哪一版？"),
        lambda: ("hi", N, f"मेरा ऑर्डर नंबर {order_no()} है, डिलीवरी कब होगी?"),
        lambda: ("hi", N, f"version v{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)} में क्या बदला है?"),
        lambda: ("hi", N, f"{big_number()} को 12 से भाग देने पर शेष क्या आएगा?"),
        lambda: ("hi", N, f"ट्रैकिंग नंबर {tracking_no()} पर कोई अपडेट नहीं है।"),
    ]


# --------------------------------------------------------------------------
# Collision checks: a prompt must not hold a kind it isn't labelled with by
# accident (a phone number that also passes Luhn, a random 18-digit run that
# is a valid resident ID, a version string that is an IPv4 address).
# --------------------------------------------------------------------------

RUN = re.compile(r"\d(?:[ .\-]?\d)*")
CN_RUN = re.compile(r"(?<![0-9])\d{17}[0-9Xx](?![0-9A-Za-z])")
QUAD = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d]|\.\d)")


def run_collisions(d: str, kinds: list[str]) -> list[str]:
    bad = []
    if 13 <= len(d) <= 19 and luhn_ok(d) and len(set(d)) > 1 and "payment-card" not in kinds:
        bad.append(f"luhn:{d}")
    if len(d) == 12 and d[0] in "23456789" and verhoeff_ok(d) and "in-aadhaar" not in kinds:
        bad.append(f"verhoeff:{d}")
    return bad


def collisions(texts: list[str], kinds: list[str], allow_ip: set[str] = frozenset()) -> list[str]:
    bad = []
    for t in texts:
        t = unicodedata.normalize("NFKC", t).replace(ZWSP, "")
        for m in RUN.finditer(t):
            # Every stretch of whole groups in a run: "113-1234567-1234567"
            # also holds "1234567-1234567".
            groups = re.split(r"[ .\-]", m.group())
            for i in range(len(groups)):
                for j in range(i + 1, len(groups) + 1):
                    bad += run_collisions("".join(groups[i:j]), kinds)
        for m in CN_RUN.finditer(t):
            if cn_ok(m.group()) and "cn-resident-id" not in kinds:
                bad.append(f"cn:{m.group()}")
        for m in QUAD.finditer(t):
            if ipv4_ok(m.group(1)) and "ip-address" not in kinds and m.group(1) not in allow_ip:
                bad.append(f"ipv4:{m.group(1)}")
    return bad


# --------------------------------------------------------------------------
# Assembly.
# --------------------------------------------------------------------------

def ordered(kinds: list[str]) -> list[str]:
    assert all(k in KINDS for k in kinds), kinds
    return sorted(set(kinds), key=KINDS.index)


class Builder:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.counters: collections.Counter = collections.Counter()

    def add(self, prefix: str, make, allow_ip: set[str] = frozenset()) -> None:
        """make() -> (lang, variant, messages, kinds); retried on a collision."""
        for _ in range(200):
            lang, variant, messages, kinds = make()
            if not collisions([m["content"] for m in messages], kinds, allow_ip):
                break
        else:
            raise RuntimeError(f"{prefix}: no collision-free sample: {collisions([m['content'] for m in messages], kinds)}")
        assert lang in LANGS, lang
        self.counters[prefix] += 1
        self.rows.append({"id": f"{prefix}-{self.counters[prefix]:03d}", "messages": messages,
                          "kinds": ordered(kinds), "lang": lang, "variant": variant})


def build() -> list[dict]:
    b = Builder()
    for kind in KINDS:
        if kind in PLANS:
            for lang, variant in PLANS[kind]:
                b.add(kind, lambda k=kind, l=lang, v=variant: (l, v, *identifier_item(k, l, v)))
            if kind == "postal-address":
                for lang, text in LANDMARKS:
                    b.add(kind, lambda l=lang, t=text: (l, "plain", user(t), ["postal-address"]))
        elif kind == "bank-account":
            for make in bank_items():
                b.add(kind, make)
        elif kind == "phone":
            for lang, variant in PHONE_PLAN:
                b.add(kind, lambda l=lang, v=variant: (l, v, *phone_item(l, v)))
        elif kind == "ip-address":
            for make in ip_items():
                b.add(kind, make)
        elif kind == "mac-address":
            for make in mac_items():
                b.add(kind, make)
        elif kind == "api-key":
            for make in api_key_items():
                b.add(kind, make)
        elif kind == "private-key":
            for make in private_key_items():
                b.add(kind, make)
        elif kind == "jwt":
            for make in jwt_items():
                b.add(kind, make)
        elif kind == "password":
            for make in password_items():
                b.add(kind, make)
        elif kind == "secret":
            for make in secret_items():
                b.add(kind, make)
        elif kind == "confidential":
            for lang, text in CONFIDENTIAL:
                b.add(kind, lambda l=lang, t=text: (l, "plain", user(t), ["confidential"]))
        else:
            raise AssertionError(kind)
    for make in multi_items():
        b.add("multi", make)
    for lang, variant, text in CLEAN_STATIC:
        b.add("clean", lambda l=lang, v=variant, t=text: (l, v, user(t), []), CLEAN_ALLOW_IP)
    for make in clean_generated():
        b.add("clean", lambda m=make: (lambda r: (r[0], r[1], user(r[2]), []))(m()))
    return b.rows


def self_test() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("GB82WEST12345698765432") and iban_ok("DE89370400440532013000")
    assert verhoeff_digit("236") == "3" and verhoeff_ok("2363")
    assert nhs_ok("9434765919")
    assert cn_ok("11010519491231002X")
    assert aba_ok("011000015")
    assert isbn13_digit("978316148410") == "0"
    assert vat_de.__name__ and ipv4_ok("192.0.2.1") and not ipv4_ok("256.1.1.1")


def check(rows: list[dict]) -> None:
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    per_kind = collections.Counter(k for r in rows for k in r["kinds"])
    for k in KINDS:
        assert per_kind[k] >= 12, (k, per_kind[k])
    assert per_kind["confidential"] >= 25
    langs = collections.Counter(r["lang"] for r in rows)
    assert langs["zh"] >= 30, langs
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-1] == "user" and roles[0] == "user", r["id"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    self_test()
    rows = build()
    check(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    args.out.write_bytes(data)

    sensitive = [r for r in rows if r["kinds"]]
    print(f"wrote {args.out} ({len(rows)} prompts: {len(sensitive)} sensitive, "
          f"{len(rows) - len(sensitive)} clean; {len(data)} bytes; "
          f"sha256 {hashlib.sha256(data).hexdigest()})")
    per_kind = collections.Counter(k for r in rows for k in r["kinds"])
    print("kinds:    " + ", ".join(f"{k} {per_kind[k]}" for k in KINDS))
    multi = sum(1 for r in rows if len(r["kinds"]) > 1)
    print(f"multi-kind prompts: {multi}")
    print("langs:    " + ", ".join(f"{k} {v}" for k, v in
                                   sorted(collections.Counter(r["lang"] for r in rows).items())))
    print("variants: " + ", ".join(f"{k} {v}" for k, v in
                                   sorted(collections.Counter(r["variant"] for r in rows).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
