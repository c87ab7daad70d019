"""Tool calling through the official `openai` SDK: tool_choice required (plain and streamed),
a named function, auto, and a second round with the tool's answer. Prints one JSON object."""

import json
import sys

import jsonschema
import openai

base, = sys.argv[1:]
client = openai.OpenAI(base_url=base, api_key="none")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
messages = [{"role": "user", "content": "What is the weather in Paris?"}]


def validated(name, arguments):
    try:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        return None
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"[:300]


out = {}
r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required",
                                   max_tokens=80, temperature=0)
calls = r.choices[0].message.tool_calls or []
out["required"] = {"finish": r.choices[0].finish_reason, "calls": [
    {"id": c.id, "name": c.function.name, "arguments": c.function.arguments,
     "error": validated(c.function.name, c.function.arguments)} for c in calls]}

# Streamed: tool_calls arrive as deltas, concatenated by index as the SDK's users do.
acc, finish = {}, None
for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required",
                                            max_tokens=80, temperature=0, stream=True):
    if not chunk.choices:
        continue
    ch = chunk.choices[0]
    finish = ch.finish_reason or finish
    for d in ch.delta.tool_calls or []:
        a = acc.setdefault(d.index, {"name": "", "arguments": ""})
        if d.function and d.function.name:
            a["name"] += d.function.name
        if d.function and d.function.arguments:
            a["arguments"] += d.function.arguments
out["required_stream"] = {"finish": finish, "calls": [
    dict(v, error=validated(v["name"], v["arguments"])) for _, v in sorted(acc.items())]}

r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=80, temperature=0.5, seed=1,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
c = r.choices[0].message.tool_calls[0]
out["named"] = {"finish": r.choices[0].finish_reason, "name": c.function.name,
                "error": validated(c.function.name, c.function.arguments)}

r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=20, temperature=0)
out["auto"] = {"finish": r.choices[0].finish_reason, "has_content_or_calls":
               bool(r.choices[0].message.content) or bool(r.choices[0].message.tool_calls)}

first = out["required"]["calls"][0]
follow = messages + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": first["id"], "type": "function", "function": {
        "name": first["name"], "arguments": first["arguments"]}}]},
    {"role": "tool", "tool_call_id": first["id"], "content": json.dumps({"temperature": 21, "sky": "clear"})},
]
r = client.chat.completions.create(model="m", messages=follow, tools=TOOLS, tool_choice="none", max_tokens=20,
                                   temperature=0)
out["after_tool"] = {"finish": r.choices[0].finish_reason, "content": r.choices[0].message.content}
print(json.dumps(out))
