#!/usr/bin/env python3
"""A tool-call round trip through an edgeroute node with the official `openai`
package, as an agent would do it.

Usage: python3 tests/openai_tools.py [--local] http://127.0.0.1:8080/v1

With --local every request is marked restricted, so the node's local model
answers under its tool-call grammar: the checks are then on the shape (a
`get_weather` call whose arguments are a JSON object with a `city` string,
text after the result) rather than on the recording cloud's fixed answers,
and the calls ask for one (`tool_choice: required`: under `auto`,
SmolLM2-135M almost always answers in text), greedily, and the second turn
asks for text (`tool_choice: none`).

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
    args = sys.argv[1:]
    local = "--local" in args
    args = [a for a in args if a != "--local"]
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from openai import OpenAI

    headers = {"x-edgeroute-sensitivity": "restricted"} if local else None
    client = OpenAI(base_url=args[0], api_key="unused", max_retries=0, timeout=120.0,
                    default_headers=headers)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    # Locally: a call is required, and greedy decoding makes the run repeatable.
    choose = {"tool_choice": "required", "temperature": 0} if local else {"tool_choice": "auto"}
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, tools=TOOLS, **choose,
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
    if local and not city_argument(call.function.arguments):
        print(f"FAIL: the call's arguments have no city: {call.function.arguments!r}", file=sys.stderr)
        return 1
    second = client.chat.completions.create(
        model="auto", messages=messages, tools=TOOLS,
        **({"tool_choice": "none", "temperature": 0, "max_tokens": 48} if local else {}),
    )
    text = second.choices[0].message.content
    print(json.dumps({"step": "answer", "content": text}), flush=True)
    if not text or (not local and "18C and sunny" not in text):
        print(f"FAIL: the answer does not use the tool's result: {text!r}", file=sys.stderr)
        return 1
    # 3. the same call streamed: the SDK assembles the tool call from the
    # relayed deltas.
    stream = client.chat.completions.create(
        model="auto", messages=messages[:1], tools=TOOLS, stream=True,
        **(choose if local else {}),
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    print(json.dumps({"step": "stream", "name": name, "arguments": arguments, "finish_reason": finish}), flush=True)
    expected = city_argument(arguments) if local else json.loads(arguments or "null") == {"city": "Paris"}
    if name != "get_weather" or not expected or finish != "tool_calls":
        print("FAIL: the streamed tool call did not arrive whole", file=sys.stderr)
        return 1
    print("OK: tool-call round trip", flush=True)
    return 0


def city_argument(arguments):
    """Whether a call's arguments are a JSON object with a non-empty city."""
    try:
        parsed = json.loads(arguments or "null")
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("city"), str) and parsed["city"] != ""


if __name__ == "__main__":
    sys.exit(main())
