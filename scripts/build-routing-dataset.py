#!/usr/bin/env python3
"""Build the labelled routing dataset data/routing-qa/{train,heldout}.jsonl.

Every question has a known answer taken from registry data (PyPI packages
pinned in data/routing-qa/requirements.txt) or generated arithmetic; no other
network access. Each question is run through the local model (SmolLM2-135M
via llama.cpp, behind a real `edgeroute up` node), one request at a time, and
the answer is graded. The result is one JSON object per line:

  {"id": "capital-0007", "category": "capital", "messages": [...],
   "max_tokens": 24, "answer": "Paris",
   "targets": {"local": {"quality", "latency_ms", "cost_usd", "confidence", "answer"},
               "cloud": {"quality", "latency_ms", "cost_usd"}}}

THE CLOUD COLUMN IS MODELLED, NOT MEASURED: no cloud upstream is reachable
from the machine this is built on. quality = 1.0 for every question (short
factual and arithmetic questions a frontier model answers near-perfectly;
its real few-% error rate is not modelled, so the gap is measured against an
idealised strong model); latency_ms = 300 (round trip) + 200 (time to first
token) + CLOUD_COMPLETION_TOKENS x 10 ms (100 tokens/s); cost_usd = the
configured upstream's prices (gpt-4o-mini: 0.15 $/Mtok in, 0.60 $/Mtok out)
x (the local model's prompt tokens, CLOUD_COMPLETION_TOKENS out).

Usage (nothing is installed system-wide; no cargo build is run):

  python3 -m venv /tmp/routing-qa-venv
  /tmp/routing-qa-venv/bin/pip install -r data/routing-qa/requirements.txt
  /tmp/routing-qa-venv/bin/python scripts/build-routing-dataset.py

  # or, without a venv:
  pip install --target /tmp/routing-qa-deps -r data/routing-qa/requirements.txt
  PYTHONPATH=/tmp/routing-qa-deps python3 scripts/build-routing-dataset.py

Options: --binary (default ~/.cache/edgeroute-target/release/edgeroute),
--config (runtime-config/edgeroute.toml; the node runs a temp copy with
paths made absolute and without [local.embedding]), --port, --per-category N
(default 76: 8 x 76 = 608 questions), --limit N (only the first N questions
of each category, for a smoke run), --out DIR (default data/routing-qa),
--questions-only (print the questions, every phrasing of each, as JSON lines
and stop; needs no node: the phrasing is chosen on the node by prompt length).

Takes about 7 minutes on 2 cores (~2 choosing phrasings, ~5 answering).
The cloud is never contacted: every upstream is pointed at a closed port on
127.0.0.1 and every request is sent as `restricted`.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import unicodedata
from pathlib import Path

SEED = 20261203
MAX_TOKENS = 24
CLOUD_RTT_MS = 300
CLOUD_TTFT_MS = 200
CLOUD_MS_PER_TOKEN = 10  # 100 tokens/s
CLOUD_COMPLETION_TOKENS = 8  # a short answer: a name or a number and a full stop
CLOUD_UPSTREAM = "frontier"
DROPPED_TABLES = {"local.embedding"}

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- questions

NAME_ONLY = "Answer with the name only."
NUMBER_ONLY = "Answer with the number only."

SYMBOL_ONLY = "Answer with the symbol only."

# Several phrasings per category, from short to long. Each question gets the
# one whose prompt length (SmolLM2 tokens, chat template included) is nearest
# a target drawn uniformly from PROMPT_TOKENS for every category, so all
# categories have about the same length distribution and a prompt-length
# threshold cannot tell them apart. Arithmetic uses symbols (SmolLM2 does
# better on "7 + 8" than on "7 plus 8").
PROMPT_TOKENS = (24, 29)
CAPITAL_TEMPLATES = [
    "Capital of {x}? " + NAME_ONLY,
    "What is the capital of {x}? " + NAME_ONLY,
    "Which city is the capital of {x}? " + NAME_ONLY,
    "Which city is the national capital of {x}? " + NAME_ONLY,
    "Name the capital city of the country {x}. " + NAME_ONLY,
    "What is the name of the capital city of {x}? " + NAME_ONLY,
    "Tell me the name of the city that is the capital of {x}. " + NAME_ONLY,
]
COUNTRY_TEMPLATES = [
    "{x} is the capital of? " + NAME_ONLY,
    "{x} is the capital of which country? " + NAME_ONLY,
    "{x} is the capital city of which country? " + NAME_ONLY,
    "Of which country is the city of {x} the capital? " + NAME_ONLY,
    "Which country has the city of {x} as its capital? " + NAME_ONLY,
    "Tell me the name of the country whose capital city is {x}. " + NAME_ONLY,
]
ELEMENT_SYMBOL_TEMPLATES = [
    "Symbol for {x}? " + SYMBOL_ONLY,
    "What is the chemical symbol for {x}? " + SYMBOL_ONLY,
    "Which symbol stands for the element {x}? " + SYMBOL_ONLY,
    "Give the chemical symbol of the element {x}. " + SYMBOL_ONLY,
    "What is the symbol of the element {x} in the periodic table? " + SYMBOL_ONLY,
    "Tell me the chemical symbol used for the element {x} in the periodic table. " + SYMBOL_ONLY,
]
ELEMENT_NUMBER_TEMPLATES = [
    "Atomic number of {x}? " + NUMBER_ONLY,
    "What is the atomic number of {x}? " + NUMBER_ONLY,
    "How many protons are in one atom of {x}? " + NUMBER_ONLY,
    "What is the atomic number of the chemical element {x}? " + NUMBER_ONLY,
    "Tell me the atomic number of the element {x} in the periodic table. " + NUMBER_ONLY,
]
ADD_TEMPLATES = [
    "{a} + {b} = ? " + NUMBER_ONLY,
    "Compute {a} + {b}. " + NUMBER_ONLY,
    "What is {a} + {b}? " + NUMBER_ONLY,
    "What is the value of {a} + {b}? " + NUMBER_ONLY,
    "Please work out the value of {a} + {b} for me. " + NUMBER_ONLY,
    "Tell me the result when you compute {a} + {b} exactly. " + NUMBER_ONLY,
]
MUL_TEMPLATES = [t.replace("+", "*") for t in ADD_TEMPLATES]
# Symbols that are also common English words ("In", "As", "He", "I") would be
# found in almost any answer: those elements get no element-symbol question.
WORDLIKE_SYMBOLS = {"I", "In", "As", "He", "Be", "No", "At", "Am"}

# countryinfo entries left out: duplicates, states that no longer exist,
# disputed capitals, places whose listed capital is not a working answer.
CAPITAL_EXCLUDED = {
    "Burma",  # duplicate of Myanmar
    "Serbia and Montenegro",  # dissolved in 2006
    "Hong Kong",  # listed capital "City of Victoria"
    "Israel", "Palestine", "Palestine, State of", "Western Sahara",  # disputed
    "Montserrat",  # Plymouth abandoned since 1997
    "British Indian Ocean Territory", "South Georgia", "Svalbard and Jan Mayen",
    "French Southern and Antarctic Lands", "Pitcairn Islands", "Tokelau",
    "Cocos (Keeling) Islands", "Christmas Island", "Antilles néerlandaises",
}
# countryinfo alternative names that are not names of the country.
ALT_DROPPED = {"Thai"}
# Other accepted answers where a country has several official capitals or
# the package's is out of date.
CAPITAL_ALSO = {
    "Kazakhstan": ["Astana"],  # package: Nur-Sultan (renamed back in 2022)
    "Bolivia": ["La Paz"],  # constitutional capital Sucre, seat of government La Paz
    "South Africa": ["Cape Town", "Bloemfontein"],  # three official capitals
    "Sri Lanka": ["Sri Jayawardenepura Kotte", "Kotte"],  # package: Colombo
    "Swaziland": ["Mbabane"],  # package: Lobamba (legislative)
    "United States": ["Washington"],  # package: Washington D.C.
    "Malaysia": ["Putrajaya"],  # administrative capital
    "Netherlands": ["The Hague"],  # seat of government
    # spellings
    "Ukraine": ["Kiev"],
    "Myanmar": ["Nay Pyi Taw", "Naypyitaw"],
    "Mongolia": ["Ulan Bator"],
    "Turkmenistan": ["Ashkhabad"],
}
# periodictable uses US spellings.

CATEGORIES = [
    # (category, description) in output order
    ("country", "country from its capital, most populous countries (countryinfo)"),
    ("capital", "capital of one of the most populous countries (countryinfo)"),
    ("capital-rare", "capital of a smaller country or territory (countryinfo)"),
    ("element-symbol", "chemical symbol from the element name (periodictable)"),
    ("element-number", "atomic number from the element name (periodictable)"),
    ("add-1d", "1-digit + 1-digit addition"),
    ("add-2d", "2-digit + 2-digit addition"),
    ("mul-3d", "3-digit * 3-digit multiplication"),
]


def norm(text: str) -> str:
    """Lower case, no diacritics, punctuation to spaces, single spaces."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = re.sub(r"['\u2019`]", "", text.lower())  # Sana'a = Sanaa, N'Djamena = Ndjamena
    text = re.sub(r"[^0-9a-z]+", " ", text)
    return " ".join("saint" if w == "st" else w for w in text.split())


def load_packages():
    try:
        import countryinfo  # noqa: F401
        import periodictable  # noqa: F401
    except ImportError as e:
        sys.exit(
            f"missing package ({e.name}): install data/routing-qa/requirements.txt "
            "into a venv or a --target folder (see this script's usage text)"
        )
    from importlib.metadata import version

    return {p: version(p) for p in ("countryinfo", "periodictable")}


def country_pool():
    from countryinfo import all_countries

    by_code = {}
    for c in all_countries():
        info = c.info()
        name, capital, pop = c.name(), info.get("capital"), c.population()
        code = (info.get("ISO") or {}).get("alpha2") or ""
        if not code or not isinstance(capital, str) or not capital.strip() or not pop:
            continue
        if name in CAPITAL_EXCLUDED:
            continue
        # a capital that shares a word with its country (Mexico City, Kuwait
        # City, Luxembourg, Djibouti) would be answered by echoing the question
        if set(norm(capital).split()) & (set(norm(name).split()) - {"the", "of", "and", "saint", "st"}):
            continue
        if code in by_code and by_code[code][2] >= pop:
            continue
        # other names of the country, less its ISO codes ("US", "COD": a
        # code can be an ordinary word); "USA" is kept, it is what people say
        iso = {str(v).lower() for v in (info.get("ISO") or {}).values()} - {"usa"}
        also = [a for a in c.alt_spellings()
                if a.lower() not in iso and len(norm(a)) >= 2 and a not in ALT_DROPPED]
        by_code[code] = (name, capital, pop, also)
    return sorted(by_code.values(), key=lambda t: (-t[2], t[0]))


def make_questions(n: int) -> list[dict]:
    import periodictable

    rng = random.Random(SEED)
    out = []

    def add(category, i, candidates, answer, accepted, kind, operands=(), distractors=()):
        out.append({
            "id": f"{category}-{i:04d}",
            "category": category,
            "candidates": candidates,  # the question in every phrasing
            "target_tokens": rng.randint(*PROMPT_TOKENS),
            "prompt": None,  # chosen by choose_phrasing()
            "answer": str(answer),
            "accepted": [str(a) for a in accepted],
            "kind": kind,
            "operands": list(operands),
            "distractors": sorted(set(distractors), key=len, reverse=True),
        })

    def distractors_of(accepted, names):
        """Other entities' names that contain an accepted form ("South Sudan"
        for "Sudan"): removed from an answer before it is searched."""
        acc = {norm(a) for a in accepted}
        return [n for n in names
                if any(f" {a} " in f" {n} " for a in acc)
                and not any(f" {n} " in f" {a} " for a in acc)]

    countries = country_pool()
    common, rest = countries[:n], countries[n:]
    if len(rest) < n:
        sys.exit(f"only {len(rest)} countries left for capital-rare, need {n}")
    rare = rng.sample(rest, n)
    country_names = {norm(x) for c in countries for x in (c[0], *c[3])}
    capital_names = {norm(c[1]) for c in countries}
    for i, (name, capital, _, also) in enumerate(common):
        accepted = [name, *also]
        add("country", i, [t.format(x=capital) for t in COUNTRY_TEMPLATES], name, accepted, "name",
            distractors=distractors_of(accepted, country_names))
    for cat, pool in (("capital", common), ("capital-rare", rare)):
        for i, (name, capital, _, _) in enumerate(pool):
            accepted = [capital, *CAPITAL_ALSO.get(name, [])]
            add(cat, i, [t.format(x=name) for t in CAPITAL_TEMPLATES], capital, accepted, "name",
                distractors=distractors_of(accepted, capital_names))

    elements = [e for e in periodictable.elements if e.number > 0]
    symbol_pool = [e for e in elements if e.symbol not in WORDLIKE_SYMBOLS]
    for i, e in enumerate(rng.sample(symbol_pool, n)):
        add("element-symbol", i, [t.format(x=e.name.capitalize()) for t in ELEMENT_SYMBOL_TEMPLATES], e.symbol, [e.symbol], "symbol")
    for i, e in enumerate(rng.sample(elements, n)):
        add("element-number", i, [t.format(x=e.name.capitalize()) for t in ELEMENT_NUMBER_TEMPLATES], e.number, [e.number], "number")

    def pairs(lo_a, hi_a, lo_b, hi_b):
        space = [(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1)]
        return rng.sample(space, n) if len(space) >= n else sys.exit("too few pairs")

    for cat, ab, templates, op in (
        ("add-1d", (1, 9, 1, 9), ADD_TEMPLATES, "add"),
        ("add-2d", (10, 99, 10, 99), ADD_TEMPLATES, "add"),
        ("mul-3d", (100, 999, 100, 999), MUL_TEMPLATES, "mul"),
    ):
        for i, (a, b) in enumerate(pairs(*ab)):
            if rng.random() < 0.5:
                a, b = b, a
            result = a + b if op == "add" else a * b
            add(cat, i, [t.format(a=a, b=b) for t in templates], result, [result], "number", (a, b))
    return out


# ---------------------------------------------------------------- grading

NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}(?!\d))", "", text)  # 1,234
    return [float(m) for m in NUMBER_RE.findall(text)]


def grade(q: dict, answer: str) -> float:
    """1.0 when the answer is right, else 0.0.

    name:   after norm() (case, diacritics, apostrophes, punctuation; "St"
            = "Saint"), one accepted form appears in the answer as a whole
            word or word sequence, once the names of other entities that
            contain it are taken out ("South Sudan" does not answer "Sudan").
    symbol: the symbol appears in the answer as a word, case-sensitively
            ("Fe" in "The chemical symbol for Iron is Fe.").
    number: the first number in the answer that is not one of the question's
            own operands (so "347 * 829 = 31342" is judged on 31342) equals
            the expected value; thousands separators are allowed.
    """
    if q["kind"] == "name":
        hay = f" {norm(answer)} "
        for d in q["distractors"]:  # longest first
            hay = hay.replace(f" {d} ", " | ")
        return 1.0 if any(f" {norm(a)} " in hay for a in q["accepted"]) else 0.0
    if q["kind"] == "symbol":
        return 1.0 if q["answer"] in re.findall(r"[A-Za-z]+", answer) else 0.0
    operands = {float(x) for x in q["operands"]}
    rest = [x for x in numbers_in(answer) if x not in operands]
    return 1.0 if rest and rest[0] == float(q["answer"]) else 0.0


# ---------------------------------------------------------------- the node

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_config(src: Path, dst_dir: Path) -> tuple[Path, list[str], dict]:
    """A copy of the config with relative paths made absolute, less the
    tables this script has no use for ([local.embedding]: the embedding
    model is not needed to answer, and a binary older than the config may
    not know the table)."""
    text = src.read_text()
    cfg = tomllib.loads(text)
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[+\s*([^\]]+?)\s*\]", line)
        if header:
            skipping = header.group(1) in DROPPED_TABLES
            # the comment block just above a dropped table goes with it
            while skipping and out and out[-1].lstrip().startswith("#"):
                out.pop()
        if skipping:
            continue
        m = re.match(r'(\s*path\s*=\s*)"([^"]+)"', line)
        if m and not os.path.isabs(m.group(2)):
            absolute = (src.parent / m.group(2)).resolve()
            if not absolute.exists():
                sys.exit(f"model not found: {absolute} (scripts/fetch-models.sh fetches it)")
            line = f'{m.group(1)}"{absolute}"\n'
        out.append(line)
    dst = dst_dir / "edgeroute.toml"
    dst.write_text("".join(out))
    tomllib.loads(dst.read_text())  # still valid
    upstreams = {u["name"]: u for u in cfg.get("cloud", {}).get("upstreams", [])}
    return dst, [m["name"] for m in cfg["local"]["models"]], upstreams


def request(port: int, method: str, path: str, body: dict | None = None, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    h = {"content-type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, payload


def start_node(binary: Path, config: Path, port: int, upstreams: dict, log: Path):
    cmd = [str(binary), "up", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    # No cloud is reachable; point every upstream at a closed local port so a
    # request can never leave the machine, whatever the policy decides.
    for name in upstreams:
        cmd += ["--upstream", f"{name}=http://127.0.0.1:9/v1"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"node exited ({proc.returncode}); log: {log}\n{log.read_text()[-2000:]}")
        try:
            status, _, body = request(port, "GET", "/healthz", timeout=2)
            if status == 200 and json.loads(body).get("status") == "ok":
                return proc, cmd
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    sys.exit(f"node did not become healthy in 120 s; log: {log}")


def stop_node(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ask_local(port: int, model: str, prompt: str) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    # restricted: the host's guard keeps the request on this node whatever
    # the policy says (the "model" field alone does not force placement).
    headers = {"x-edgeroute-sensitivity": "restricted"}
    t0 = time.perf_counter()
    status, h, payload = request(port, "POST", "/v1/chat/completions", body, headers)
    latency_ms = (time.perf_counter() - t0) * 1000
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {payload[:300]!r}")
    if h.get("x-edgeroute-target") != f"local:{model}":
        raise RuntimeError(f"not answered locally: {h.get('x-edgeroute-target')} ({h.get('x-edgeroute-reason')})")
    r = json.loads(payload)
    return {
        "text": r["choices"][0]["message"]["content"],
        "confidence": float(h["x-edgeroute-confidence"]),
        "latency_ms": latency_ms,
        "prompt_tokens": r["usage"]["prompt_tokens"],
        "completion_tokens": r["usage"]["completion_tokens"],
        "cached_tokens": int(h.get("x-edgeroute-cached-tokens", 0)),
    }


def prompt_tokens(port: int, model: str, prompt: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1, "temperature": 0}
    status, _, payload = request(port, "POST", "/v1/chat/completions", body,
                                 {"x-edgeroute-sensitivity": "restricted"})
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {payload[:300]!r}")
    return json.loads(payload)["usage"]["prompt_tokens"]


def choose_phrasing(port: int, model: str, questions: list[dict]):
    """Give each question the phrasing whose prompt length is nearest its
    target. Lengths are measured on the node (its tokenizer and chat
    template): every phrasing of a category's first question, then one
    phrasing of each question, the others estimated by the same difference
    (the entity's tokens do not depend on the phrasing around it)."""
    base = {}
    for k, q in enumerate(questions, 1):
        cat = q["category"]
        if cat not in base:
            base[cat] = [prompt_tokens(port, model, c) for c in q["candidates"]]
        delta = prompt_tokens(port, model, q["candidates"][0]) - base[cat][0]
        est = [b + delta for b in base[cat]]
        best = min(range(len(est)), key=lambda j: (abs(est[j] - q["target_tokens"]), j))
        q["prompt"] = q["candidates"][best]
        q["phrasing"] = best
        if k % 100 == 0 or k == len(questions):
            print(f"  phrasing {k}/{len(questions)}", flush=True)


# ---------------------------------------------------------------- output

def auroc(pos: list[float], neg: list[float]) -> float | None:
    """P(a random positive scores above a random negative), ties count half."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}){mem}"


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def write_readme(out: Path, rows: list[dict], meta: dict):
    cats = [c for c, _ in CATEGORIES]
    desc = dict(CATEGORIES)
    lines = []
    table = ["| category | what | n (train/heldout) | local accuracy | mean confidence | confidence right / wrong | mean prompt tokens | mean local latency ms |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cats + ["all"]:
        rs = [r for r in rows if c == "all" or r["category"] == c]
        if not rs:
            continue
        n_tr = sum(r["split"] == "train" for r in rs)
        acc = sum(r["quality"] for r in rs) / len(rs)
        conf = sum(r["confidence"] for r in rs) / len(rs)
        pt = sum(r["prompt_tokens"] for r in rs) / len(rs)
        lat = sum(r["latency_ms"] for r in rs) / len(rs)
        c_right = [r["confidence"] for r in rs if r["quality"] == 1.0]
        c_wrong = [r["confidence"] for r in rs if r["quality"] == 0.0]
        rw = " / ".join("-" if not xs else f"{sum(xs) / len(xs):.3f}" for xs in (c_right, c_wrong))
        name = "**all**" if c == "all" else f"`{c}`"
        table.append(f"| {name} | {desc.get(c, '')} | {len(rs)} ({n_tr}/{len(rs) - n_tr}) | "
                     f"{acc:.2f} | {conf:.3f} | {rw} | {pt:.1f} | {lat:.0f} |")
    right = [r["confidence"] for r in rows if r["quality"] == 1.0]
    wrong = [r["confidence"] for r in rows if r["quality"] == 0.0]
    pt_right = [-r["prompt_tokens"] for r in rows if r["quality"] == 1.0]
    pt_wrong = [-r["prompt_tokens"] for r in rows if r["quality"] == 0.0]
    auc_conf = auroc(right, wrong)
    auc_len = auroc(pt_right, pt_wrong)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731

    lines += [
        "# routing-qa: a labelled routing dataset",
        "",
        "Short questions with known answers, each run through the local model",
        "(SmolLM2-135M-Instruct Q4_1 via llama.cpp, behind a real `edgeroute up`",
        "node) and graded, with a modelled cloud column, so a routing policy can be",
        "scored offline (APGR: the share of the quality gap between all-local and",
        "all-cloud that a policy recovers, RouteLLM-style).",
        "",
        "```sh",
        "edgeroute policy replay data/routing-qa/heldout.jsonl candidate.wasm",
        "```",
        "",
        "Files: `train.jsonl` and `heldout.jsonl` (a fixed 50/50 split, stratified",
        "by category), `requirements.txt` (the pinned registry packages). One JSON",
        "object per line:",
        "",
        "```json",
        json.dumps(meta["example"], ensure_ascii=False),
        "```",
        "",
        "## Where the questions come from",
        "",
        "Registry data only (PyPI), no other download: "
        + ", ".join(f"`{p}=={v}`" for p, v in meta["packages"].items())
        + f" (`requirements.txt` pins their dependencies too); random choices use the fixed seed {SEED}.",
        "",
        f"- `country` (country from its capital) and `capital` (capital from the",
        f"  country): the {meta['n']} most populous countries in `countryinfo` (its population",
        "  figures); `capital-rare`: a random sample of the rest (smaller states and",
        "  territories). Left out: duplicates (Burma/Myanmar), dissolved states,",
        "  disputed capitals, and countries whose capital shares a word with the",
        "  country's name (Mexico City, Luxembourg: echoing the question would score).",
        "  Also accepted for `capital*` where a country has several capitals or the",
        "  package's is out of date: Astana (Kazakhstan), La Paz (Bolivia), Cape Town",
        "  and Bloemfontein (South Africa), Sri Jayawardenepura Kotte (Sri Lanka),",
        "  Mbabane (Eswatini), Washington (United States), Putrajaya (Malaysia), The",
        "  Hague (Netherlands), and the spellings Kiev, Nay Pyi Taw, Ulan Bator,",
        "  Ashkhabad; for `country`, the package's other names of the country (less",
        "  its ISO codes, plus \"USA\").",
        "- `element-symbol` (symbol from the name; elements whose symbol is an English",
        "  word, I In As He Be No At Am, left out) and `element-number` (atomic number",
        "  from the name): random samples of the 118 elements in `periodictable`.",
        "- arithmetic, generated: `add-1d` (1..9 + 1..9), `add-2d` (10..99 + 10..99),",
        "  `mul-3d` (100..999 * 100..999), written with `+` and `*`.",
        "",
        "Each category has 5-7 phrasings, from \"Capital of X?\" to \"Tell me the name",
        "of the city that is the capital of X.\", each ending \"Answer with the name",
        "only.\" (symbol / number). Every question draws a target prompt length,",
        f"uniformly {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} SmolLM2 tokens (chat template included) for every",
        "category, and gets the phrasing nearest it (lengths measured on the node, on",
        "a node of their own so the answering node's prefix cache holds none of the",
        "prompts). So all categories have about the same prompt-length distribution",
        "(see the table): a prompt-length threshold cannot tell the easy categories",
        "from the hard ones.",
        "",
        "## How the local column was obtained",
        "",
        "Every question, one at a time, as `POST /v1/chat/completions` with",
        f"`\"model\": \"smollm2\"`, `max_tokens` {MAX_TOKENS}, `temperature` 0 (greedy), header",
        "`x-edgeroute-sensitivity: restricted` (the host's guard then keeps it on the",
        "node whatever the policy says; every response was checked to be",
        "`x-edgeroute-target: local:smollm2`). Recorded: the answer text, the",
        "`x-edgeroute-confidence` header (geometric mean of the generated tokens'",
        "probabilities), the client's wall-clock latency (`latency_ms`, including",
        "HTTP on loopback; the node's prefix cache was on, as in the shipped config),",
        "and `cost_usd` 0.",
        "",
        "Grading (`grade()` in the script), quality 1.0 or 0.0:",
        "",
        "- names: case, diacritics, apostrophes and punctuation are normalised away",
        "  (\"St\" = \"Saint\"); right when an accepted form appears in the answer as a",
        "  whole word (or word sequence), once names of other places that contain it",
        "  are taken out (\"South Sudan\" does not answer \"Sudan\"). \"The capital of",
        "  France is Paris.\" is right. Lenient: an answer that lists several names",
        "  including the right one also counts, and `country` is judged on the country",
        "  named whatever else the answer says.",
        "- symbols: the symbol appears in the answer as a word, case-sensitively",
        "  (\"Fe\" in \"The chemical symbol for Iron is Fe.\"; \"FE\" or \"Iron\" is wrong).",
        "- numbers: the first number in the answer that is not one of the question's",
        "  own operands must equal the answer (thousands separators allowed), so",
        "  \"347 * 829 = 31342\" is judged on 31342.",
        "",
        "## How the cloud column was obtained, and its limits",
        "",
        "**It is modelled, not measured**: no cloud upstream is reachable from the",
        "machine the dataset was built on.",
        "",
        "- `quality` 1.0 for every question. These are short factual and arithmetic",
        "  questions a frontier model answers near-perfectly; the real cloud's few-%",
        "  error rate (3-digit multiplication especially) is not modelled, so the",
        "  gap is measured against an idealised strong model.",
        f"- `latency_ms` = {CLOUD_RTT_MS} (round trip) + {CLOUD_TTFT_MS} (time to first token) +",
        f"  {CLOUD_COMPLETION_TOKENS} completion tokens x {CLOUD_MS_PER_TOKEN} ms (100 tokens/s) = "
        f"{CLOUD_RTT_MS + CLOUD_TTFT_MS + CLOUD_COMPLETION_TOKENS * CLOUD_MS_PER_TOKEN} ms.",
        f"- `cost_usd` = the `{CLOUD_UPSTREAM}` upstream's prices in runtime-config (gpt-4o-mini:",
        f"  {meta['price_in']} $/Mtok in, {meta['price_out']} $/Mtok out) x the local model's prompt tokens",
        f"  and {CLOUD_COMPLETION_TOKENS} completion tokens (gpt-4o-mini's tokenizer would count a",
        "  little differently).",
        "",
        "## Results",
        "",
        *table,
        "",
        f"All-local quality {mean([r['quality'] for r in rows]):.3f}, all-cloud 1.000 (modelled).",
        f"Mean confidence of right local answers {fmt(mean(right), '.3f')} (n={len(right)}), of wrong",
        f"ones {fmt(mean(wrong), '.3f')} (n={len(wrong)}); AUROC of confidence for right-vs-wrong",
        f"{fmt(auc_conf, '.3f')}, of a short prompt (fewer prompt tokens) {fmt(auc_len, '.3f')} (0.5 = no signal).",
        "",
        f"Built {meta['date']} on {meta['machine']}, edgeroute release binary",
        f"`{meta['binary_version']}`, model `{meta['model']}`; {len(rows)} requests in",
        f"{meta['elapsed_s'] / 60:.1f} min ({meta['phrasing_s'] / 60:.1f} of them choosing phrasings; load average at start {meta['load_start']}, at end",
        f"{meta['load_end']}: latencies are this 2-core machine's, with whatever else ran on it).",
        "",
        "## Rebuild",
        "",
        "```sh",
        "python3 -m venv /tmp/routing-qa-venv",
        "/tmp/routing-qa-venv/bin/pip install -r data/routing-qa/requirements.txt",
        "/tmp/routing-qa-venv/bin/python scripts/build-routing-dataset.py   # needs the release binary and models/",
        "```",
        "",
        "The questions, answers and split are deterministic (fixed seed, pinned",
        "packages); local answers are greedy and should repeat; latencies will not.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=Path.home() / ".cache/edgeroute-target/release/edgeroute")
    ap.add_argument("--config", type=Path, default=REPO / "runtime-config/edgeroute.toml")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--per-category", type=int, default=76)
    ap.add_argument("--limit", type=int, default=0, help="only the first N of each category (smoke run)")
    ap.add_argument("--out", type=Path, default=REPO / "data/routing-qa")
    ap.add_argument("--questions-only", action="store_true")
    args = ap.parse_args()

    packages = load_packages()
    questions = make_questions(args.per_category)
    if args.limit:
        questions = [q for q in questions if int(q["id"].rsplit("-", 1)[1]) < args.limit]
    if args.questions_only:
        for q in questions:
            print(json.dumps(q, ensure_ascii=False))
        return

    # the fixed 50/50 split, stratified by category
    split_rng = random.Random(SEED + 1)
    split = {}
    for cat, _ in CATEGORIES:
        ids = [q["id"] for q in questions if q["category"] == cat]
        split_rng.shuffle(ids)
        for k, i in enumerate(ids):
            split[i] = "train" if k < (len(ids) + 1) // 2 else "heldout"

    if not args.binary.exists():
        sys.exit(f"no binary at {args.binary} (build it with ./dev up, or pass --binary)")
    tmp = Path(tempfile.mkdtemp(prefix="routing-qa-"))
    config, models, upstreams = node_config(args.config.resolve(), tmp)
    model = "smollm2" if "smollm2" in models else models[0]
    up = upstreams.get(CLOUD_UPSTREAM) or next(iter(upstreams.values()))
    price_in, price_out = up["usd_per_mtok_in"], up["usd_per_mtok_out"]
    binary_version = subprocess.run([str(args.binary), "--version"], capture_output=True, text=True).stdout.strip()
    port = args.port or free_port()
    load_start = f"{os.getloadavg()[0]:.2f}"
    t_start = time.time()

    # 1. phrasings, on a node of their own, so that the answering node's
    #    prefix cache holds none of these prompts
    proc, cmd = start_node(args.binary, config, port, upstreams, tmp / "node-lengths.log")
    print(f"node: {' '.join(cmd)}", flush=True)
    print("choosing phrasings by prompt length ...", flush=True)
    try:
        choose_phrasing(port, model, questions)
    finally:
        stop_node(proc)
    t_phrasing = time.time() - t_start

    # 2. the answers
    proc, _ = start_node(args.binary, config, port, upstreams, tmp / "node.log")
    rows, records = [], []
    print(f"asking {len(questions)} questions, one at a time ...", flush=True)
    try:
        ask_local(port, model, "Say hello.")  # warm-up, not recorded
        for k, q in enumerate(questions, 1):
            r = ask_local(port, model, q["prompt"])
            quality = grade(q, r["text"])
            cloud_latency = CLOUD_RTT_MS + CLOUD_TTFT_MS + CLOUD_COMPLETION_TOKENS * CLOUD_MS_PER_TOKEN
            cloud_cost = (r["prompt_tokens"] * price_in + CLOUD_COMPLETION_TOKENS * price_out) / 1e6
            records.append({
                "id": q["id"],
                "category": q["category"],
                "messages": [{"role": "user", "content": q["prompt"]}],
                "max_tokens": MAX_TOKENS,
                "answer": q["answer"],
                "targets": {
                    "local": {
                        "quality": quality,
                        "latency_ms": round(r["latency_ms"]),
                        "cost_usd": 0.0,
                        "confidence": r["confidence"],
                        "answer": r["text"],
                    },
                    "cloud": {
                        "quality": 1.0,
                        "latency_ms": cloud_latency,
                        "cost_usd": round(cloud_cost, 12),
                    },
                },
            })
            rows.append({"category": q["category"], "split": split[q["id"]], "quality": quality,
                         "phrasing": q["phrasing"],
                         "confidence": r["confidence"], "prompt_tokens": r["prompt_tokens"],
                         "latency_ms": r["latency_ms"]})
            if k % 25 == 0 or k == len(questions):
                acc = sum(x["quality"] for x in rows) / len(rows)
                print(f"{k}/{len(questions)}  {time.time() - t_start:.0f} s  local accuracy so far {acc:.2f}", flush=True)
    finally:
        stop_node(proc)
    elapsed = time.time() - t_start
    load_end = f"{os.getloadavg()[0]:.2f}"

    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("train", "heldout"):
        with (args.out / f"{name}.jsonl").open("w") as f:
            for rec in records:
                if split[rec["id"]] == name:
                    f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    write_readme(args.out, rows, {
        "packages": packages,
        "n": args.per_category,
        "example": records[0],
        "price_in": price_in,
        "price_out": price_out,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "binary_version": binary_version or str(args.binary),
        "model": next((Path(m["path"]).name for m in tomllib.loads(config.read_text())["local"]["models"]
                       if m["name"] == model), model),
        "elapsed_s": elapsed,
        "phrasing_s": t_phrasing,
        "load_start": load_start,
        "load_end": load_end,
    })
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out}/train.jsonl, heldout.jsonl, README.md in {elapsed / 60:.1f} min")


if __name__ == "__main__":
    main()
