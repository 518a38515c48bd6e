#!/usr/bin/env python3
"""A tool-call round trip through an edgeroute node with the official `openai`
package, as an agent would do it.

Usage: python3 tests/openai_tools.py http://127.0.0.1:8080/v1

1. ask with a `get_weather` tool (plus an unknown field through `extra_body`):
   the answer must be a tool call, with finish_reason "tool_calls";
2. send the tool's result back (the assistant's tool call and a `tool`
   message): the answer must be text;
3. the first call again, streamed: the tool call must arrive whole.
Prints one JSON line per step; exits non-zero with a message on failure. The
end-to-end test (tests/e2e/tools.rs) checks what reached the recording cloud.
"""

import json
import sys

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}]


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from openai import OpenAI

    client = OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=60.0)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, tools=TOOLS, tool_choice="auto",
        extra_body={"x_custom_field": {"kept": True}},
    )
    first = raw.parse()
    choice = first.choices[0]
    calls = choice.message.tool_calls or []
    print(json.dumps({
        "step": "call",
        "target": raw.headers.get("x-edgeroute-target"),
        "reason": raw.headers.get("x-edgeroute-reason"),
        "finish_reason": choice.finish_reason,
        "tool_calls": [c.model_dump() for c in calls],
    }), flush=True)
    if choice.finish_reason != "tool_calls" or not calls:
        print(f"FAIL: expected a tool call, got {choice.model_dump()}", file=sys.stderr)
        return 1

    call = calls[0]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"})
    second = client.chat.completions.create(model="auto", messages=messages, tools=TOOLS)
    text = second.choices[0].message.content
    print(json.dumps({"step": "answer", "content": text}), flush=True)
    if not text or "18C and sunny" not in text:
        print(f"FAIL: the answer does not use the tool's result: {text!r}", file=sys.stderr)
        return 1
    # 3. the same call streamed: the SDK assembles the tool call from the
    # relayed deltas.
    stream = client.chat.completions.create(
        model="auto", messages=messages[:1], tools=TOOLS, stream=True,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    print(json.dumps({"step": "stream", "name": name, "arguments": arguments, "finish_reason": finish}), flush=True)
    if name != "get_weather" or json.loads(arguments or "null") != {"city": "Paris"} or finish != "tool_calls":
        print("FAIL: the streamed tool call did not arrive whole", file=sys.stderr)
        return 1
    print("OK: tool-call round trip", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
