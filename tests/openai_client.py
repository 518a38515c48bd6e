#!/usr/bin/env python3
"""Drive an edgeroute node with the official `openai` package, as a user would.

Usage: python3 tests/openai_client.py http://127.0.0.1:8080/v1

Checks, in order:
  1. a non-streaming chat completion (model "smollm2") returns non-empty text;
  2. the same through `with_raw_response`, printing the x-edgeroute-target header;
  3. a streaming chat completion yields >= 2 content chunks and a finish reason;
  4. `client.models.list()` lists "smollm2".
Prints one JSON summary line per check; exits non-zero with a message on failure.
The end-to-end test tests/e2e.rs runs this against a real node.
"""

import json
import sys

PROMPT = "Say hello in one short sentence."
MODEL = "smollm2"


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def report(name, **fields):
    print(json.dumps({"check": name, **fields}, ensure_ascii=False), flush=True)


def run(base_url):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180.0)
    messages = [{"role": "user", "content": PROMPT}]

    # 1. non-streaming
    completion = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    check(completion.choices, "non-streaming completion has no choices")
    content = completion.choices[0].message.content
    check(isinstance(content, str) and content.strip(), f"empty content: {content!r}")
    usage = completion.usage.model_dump() if completion.usage else None
    report(
        "chat",
        id=completion.id,
        model=completion.model,
        content=content,
        finish_reason=completion.choices[0].finish_reason,
        usage=usage,
    )

    # 2. raw response: the routing headers are visible to SDK users
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    target = raw.headers.get("x-edgeroute-target")
    reason = raw.headers.get("x-edgeroute-reason")
    parsed = raw.parse()
    check(target, "response has no x-edgeroute-target header")
    check(
        target.startswith("local:") or target.startswith("cloud:"),
        f"x-edgeroute-target should be local:NAME or cloud:NAME, got {target!r}",
    )
    check(parsed.choices and parsed.choices[0].message.content, "raw response parsed to no content")
    report("raw", status=raw.status_code, **{"x-edgeroute-target": target, "x-edgeroute-reason": reason})

    # 3. streaming
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True
    )
    content_chunks = 0
    pieces = []
    finish_reason = None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                content_chunks += 1
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
    text = "".join(pieces)
    check(content_chunks >= 2, f"stream yielded {content_chunks} content chunk(s), want >= 2: {text!r}")
    check(finish_reason is not None, "stream ended without a finish_reason")
    report("stream", content_chunks=content_chunks, content=text, finish_reason=finish_reason)

    # 4. models
    ids = [model.id for model in client.models.list()]
    check(MODEL in ids, f"{MODEL!r} missing from models.list(): {ids}")
    report("models", ids=ids)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import openai
    except ImportError:
        print("FAIL: the openai package is not installed: pip install -r tests/requirements.txt", file=sys.stderr)
        return 1
    try:
        run(sys.argv[1])
    except CheckFailed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    except openai.APIStatusError as e:
        print(f"FAIL: HTTP {e.status_code} from the node: {e.response.text[:2000]}", file=sys.stderr)
        return 1
    except openai.APIError as e:
        print(f"FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("OK: openai client checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
