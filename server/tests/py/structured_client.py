"""Structured output through the official `openai` SDK: for each of 20 JSON schemas, ask the
server (plain and streamed, chat and completions) and check the answer with `jsonschema`.
Prints one JSON object with every result; the Rust test asserts on it."""

import json
import sys

import jsonschema
import openai

base, = sys.argv[1:]
client = openai.OpenAI(base_url=base, api_key="none")

S = {"type": "string", "maxLength": 24}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": S}, "required": ["ok"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -10, "maximum": 10}, "y": {"type": "number", "minimum": -10, "maximum": 10}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "integer", "minimum": 1, "maximum": 1000},
    {"type": "object", "properties": {"city": S, "country": S, "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
     "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "event"}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
     "required": ["kind", "year"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "label": S},
     "required": ["id", "label"], "additionalProperties": False}, "maxItems": 2},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 16},
     "pages": {"type": "integer", "minimum": 1, "maximum": 999}, "isbn": {"type": "string", "pattern": "^[0-9]{4}$"}},
     "required": ["title", "pages", "isbn"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 50},
     "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3},
    {"type": "object", "properties": {"first": S, "last": S, "email": {"type": "string", "maxLength": 30}},
     "required": ["first", "last"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 100},
     "maxItems": 3}, "total": {"type": "number", "minimum": 0, "maximum": 300}}, "required": ["items", "total"],
     "additionalProperties": False},
    {"$defs": {"pet": {"type": "object", "properties": {"species": {"enum": ["cat", "dog"]}, "name": S},
     "required": ["species", "name"], "additionalProperties": False}},
     "type": "object", "properties": {"pet": {"$ref": "#/$defs/pet"}}, "required": ["pet"], "additionalProperties": False},
]
assert len(SCHEMAS) == 20

PROMPT = "Reply with JSON only. Describe something about the weather, a person, or a city."


def fmt(i, schema):
    return {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}


def check(content, schema):
    try:
        jsonschema.validate(json.loads(content), schema)
        return None
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"[:300]


results = []
for i, schema in enumerate(SCHEMAS):
    # Alternate streaming, and chat vs completions, so that every path is covered.
    stream = i % 2 == 1
    messages = [{"role": "user", "content": PROMPT}]
    r = {"i": i, "stream": stream}
    if i % 4 == 3:
        r["endpoint"] = "completions"
        kw = dict(model="m", prompt=PROMPT + "\nJSON:", max_tokens=200, temperature=0.7, seed=i,
                  extra_body={"response_format": fmt(i, schema)})
        if stream:
            text, finish = "", None
            for chunk in client.completions.create(stream=True, **kw):
                if chunk.choices:
                    text += chunk.choices[0].text or ""
                    finish = chunk.choices[0].finish_reason or finish
        else:
            c = client.completions.create(**kw)
            text, finish = c.choices[0].text, c.choices[0].finish_reason
    else:
        r["endpoint"] = "chat"
        kw = dict(model="m", messages=messages, max_tokens=200, temperature=0 if i % 3 == 0 else 0.8,
                  seed=i, response_format=fmt(i, schema))
        if stream:
            text, finish = "", None
            for chunk in client.chat.completions.create(stream=True, **kw):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
        else:
            c = client.chat.completions.create(**kw)
            text, finish = c.choices[0].message.content, c.choices[0].finish_reason
    r.update(content=text, finish=finish, error=check(text, schema))
    results.append(r)

# json_object: any object; a schema keyword we cannot enforce: a 400 naming it; a GBNF grammar.
obj = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=200,
                                     temperature=0, response_format={"type": "json_object"})
obj_text = obj.choices[0].message.content
try:
    obj_ok = isinstance(json.loads(obj_text), dict)
except ValueError:
    obj_ok = False
try:
    client.chat.completions.create(model="m", messages=messages, max_tokens=5, response_format=fmt(
        0, {"type": "array", "uniqueItems": True}))
    unsupported = {"status": 200}
except openai.BadRequestError as e:
    unsupported = {"status": e.status_code, "message": e.body.get("message") if isinstance(e.body, dict) else str(e)}
g = client.completions.create(model="m", prompt="Is the sky blue?", max_tokens=10, temperature=1.0, seed=3,
                              extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
# Log-probabilities: five alternatives per token, plain and streamed, chat and completions.
lp_kw = dict(model="m", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0,
             logprobs=True, top_logprobs=5)
c = client.chat.completions.create(**lp_kw)


def entries(content):
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
             "top": [{"token": t.token, "logprob": t.logprob} for t in e.top_logprobs]} for e in content]


lp_chat = {"content": c.choices[0].message.content, "tokens": entries(c.choices[0].logprobs.content)}
streamed, lp_stream_text = [], ""
for chunk in client.chat.completions.create(stream=True, **lp_kw):
    if chunk.choices and chunk.choices[0].logprobs is not None and chunk.choices[0].logprobs.content:
        streamed += entries(chunk.choices[0].logprobs.content)
    if chunk.choices:
        lp_stream_text += chunk.choices[0].delta.content or ""
cc = client.completions.create(model="m", prompt="The sky is", max_tokens=6, temperature=0, logprobs=3)
lp_completion = {"text": cc.choices[0].text, "tokens": cc.choices[0].logprobs.tokens,
                 "token_logprobs": cc.choices[0].logprobs.token_logprobs,
                 "top_logprobs": cc.choices[0].logprobs.top_logprobs,
                 "text_offset": cc.choices[0].logprobs.text_offset}
print(json.dumps({"logprobs": {"chat": lp_chat, "chat_stream": {"content": lp_stream_text, "tokens": streamed},
                               "completion": lp_completion},
                  "schemas": results, "json_object": {"content": obj_text, "ok": obj_ok,
                  "finish": obj.choices[0].finish_reason,
                  "completion_tokens": obj.usage.completion_tokens}, "unsupported": unsupported,
                  "gbnf": {"text": g.choices[0].text, "finish": g.choices[0].finish_reason}}))
