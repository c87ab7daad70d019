"""Drives llm-server's /v1/messages with the official `anthropic` SDK (the key as x-api-key):
messages.create plain, with a stop sequence, cut by max_tokens, with a tool (and the round trip with
its result), messages.stream (plain and with a tool), and errors in Anthropic's shape. Prints one
JSON object of findings for the Rust test to check; any failed expectation raises here.

usage: anthropic_client.py BASE_URL API_KEY
"""
import json
import sys

import anthropic
import jsonschema

base_url, api_key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
out = {}

# The default model is a base model: this prompt is one it ends by itself (greedy).
SYSTEM = "Answer in one short sentence."
HELLO = [{"role": "user", "content": "Say hello."}]
# This SDK has no temperature parameter any more; the server still reads it, as older SDKs send it.
GREEDY = {"temperature": 0}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


r = client.messages.create(model="m", max_tokens=60, system=SYSTEM, messages=HELLO, extra_body=GREEDY)
assert r.type == "message" and r.role == "assistant", r
out["plain"] = {"id": r.id, "text": text_of(r), "stop_reason": r.stop_reason, "stop_sequence": r.stop_sequence,
                "types": [b.type for b in r.content], "usage": r.usage.model_dump(exclude_none=True)}


def streamed(**kwargs):
    events, texts = [], []
    with client.messages.stream(model="m", extra_body=GREEDY, **kwargs) as stream:
        for event in stream:
            events.append(event.type)
            if event.type == "text":
                texts.append(event.text)
        final = stream.get_final_message()
    return {"events": events, "text_stream": "".join(texts), "text": text_of(final),
            "stop_reason": final.stop_reason, "types": [b.type for b in final.content],
            "inputs": [b.input for b in final.content if b.type == "tool_use"],
            "usage": final.usage.model_dump(exclude_none=True)}


# Right after the plain request: its prompt is in the slot's cache.
out["stream"] = streamed(max_tokens=60, system=SYSTEM, messages=HELLO)

# A stop sequence from inside that answer: the text ends before it, and it is named.
plain = out["plain"]["text"]
stop = plain[len(plain) // 2:len(plain) // 2 + 3]
r = client.messages.create(model="m", max_tokens=60, system=[{"type": "text", "text": SYSTEM}],
                           messages=HELLO, extra_body=GREEDY, stop_sequences=[stop])
out["stop"] = {"stop": stop, "text": text_of(r), "stop_reason": r.stop_reason, "stop_sequence": r.stop_sequence}

r = client.messages.create(model="m", max_tokens=2, system=SYSTEM, messages=HELLO, extra_body=GREEDY)
out["max_tokens"] = {"text": text_of(r), "stop_reason": r.stop_reason, "output_tokens": r.usage.output_tokens}

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.messages.create(model="m", max_tokens=80, messages=ASK, tools=TOOLS, tool_choice={"type": "any"},
                           extra_body=GREEDY)
uses = [b for b in r.content if b.type == "tool_use"]
for u in uses:
    jsonschema.validate(u.input, WEATHER)
out["tool"] = {"stop_reason": r.stop_reason, "types": [b.type for b in r.content],
               "uses": [{"id": u.id, "name": u.name, "input": u.input} for u in uses]}

follow = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                              "content": json.dumps({"temperature": 21, "sky": "clear"})}]}]
r = client.messages.create(model="m", max_tokens=30, messages=follow, tools=TOOLS, tool_choice={"type": "none"},
                           extra_body=GREEDY)
out["after_tool"] = {"types": [b.type for b in r.content], "text": text_of(r), "stop_reason": r.stop_reason}


# text_stream, as the SDK's users read it.
with client.messages.stream(model="m", max_tokens=60, system=SYSTEM, messages=HELLO,
                            extra_body=GREEDY) as stream:
    out["text_stream"] = "".join(stream.text_stream)
out["stream_tool"] = streamed(max_tokens=80, messages=ASK, tools=TOOLS, tool_choice={"type": "any"})

errors = {}
try:
    # The SDK will not send a request without max_tokens; its low-level post will.
    client.post("/v1/messages", body={"model": "m", "messages": HELLO}, cast_to=anthropic.types.Message)
except anthropic.BadRequestError as e:
    errors["no_max_tokens"] = {"status": e.status_code, "body": e.body}
try:
    anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
        model="m", max_tokens=5, messages=HELLO)
except anthropic.AuthenticationError as e:
    errors["wrong_key"] = {"status": e.status_code, "body": e.body}
out["errors"] = errors
print(json.dumps(out))
