"""Drives llm-server's /v1/responses with the official `openai` SDK: responses.create plain, with a
json_schema text.format, with a function tool (and the round trip with its output), and
responses.stream (plain and with a tool); refused state. Prints one JSON object of findings for the
Rust test to check; any failed expectation raises here.

usage: responses_client.py BASE_URL API_KEY
"""
import json
import sys

import jsonschema
import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
out = {}

# The default model is a base model: this prompt is one it ends by itself (greedy).
SYSTEM = "Answer in one short sentence."
HELLO = "Say hello."
r = client.responses.create(model="m", input=HELLO, instructions=SYSTEM, max_output_tokens=60,
                            temperature=0)
assert r.object == "response" and r.store is False, r
out["plain"] = {"id": r.id, "status": r.status, "text": r.output_text, "types": [o.type for o in r.output],
                "usage": r.usage.model_dump()}

# The same prompt again: found in the slot's cache.
r = client.responses.create(model="m", input=HELLO, instructions=SYSTEM, max_output_tokens=60,
                            temperature=0)
out["again"] = {"text": r.output_text, "usage": r.usage.model_dump()}

r = client.responses.create(model="m", input=HELLO, instructions=SYSTEM, max_output_tokens=3, temperature=0)
out["cut"] = {"status": r.status, "reason": r.incomplete_details.reason, "text": r.output_text,
              "output_tokens": r.usage.output_tokens}

# A message list in the Responses shape gives the same prompt as the string.
r = client.responses.create(model="m", instructions=SYSTEM, max_output_tokens=60, temperature=0,
                            input=[{"role": "user", "content": [{"type": "input_text", "text": HELLO}]}])
out["as_items"] = {"text": r.output_text}

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000}}, "required": ["city", "population"],
        "additionalProperties": False}
r = client.responses.create(model="m", input="Name a large city and its population.", max_output_tokens=60,
                            temperature=0, text={"format": {"type": "json_schema", "name": "city", "schema": CITY,
                                                            "strict": True}})
city = json.loads(r.output_text)
jsonschema.validate(city, CITY)
out["json_schema"] = {"status": r.status, "value": city, "format": r.text.format.type}

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
          "parameters": WEATHER, "strict": True}]
ASK = "What is the weather in Paris?"
r = client.responses.create(model="m", input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=80,
                            temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
for c in calls:
    jsonschema.validate(json.loads(c.arguments), WEATHER)
out["tool"] = {"types": [o.type for o in r.output], "calls": [
    {"name": c.name, "call_id": c.call_id, "arguments": json.loads(c.arguments)} for c in calls]}

# The round trip: the call as returned, its output, and an answer in text.
follow = [{"role": "user", "content": ASK}, calls[0].model_dump(exclude_none=True),
          {"type": "function_call_output", "call_id": calls[0].call_id,
           "output": json.dumps({"temperature": 21, "sky": "clear"})}]
r = client.responses.create(model="m", input=follow, tools=TOOLS, tool_choice="none", max_output_tokens=30,
                            temperature=0)
out["after_tool"] = {"types": [o.type for o in r.output], "text": r.output_text}


def streamed(**kwargs):
    events, deltas, args = [], [], []
    with client.responses.stream(model="m", temperature=0, **kwargs) as stream:
        for event in stream:
            events.append({"type": event.type, "seq": event.sequence_number})
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type == "response.function_call_arguments.delta":
                args.append(event.delta)
        final = stream.get_final_response()
    return {"events": events, "deltas": "".join(deltas), "args": "".join(args), "text": final.output_text,
            "status": final.status, "types": [o.type for o in final.output],
            "calls": [json.loads(o.arguments) for o in final.output if o.type == "function_call"],
            "usage": final.usage.model_dump()}


out["stream"] = streamed(input=HELLO, instructions=SYSTEM, max_output_tokens=60)
out["stream_tool"] = streamed(input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=80)

refused = {}
for name, extra in [("store", {"store": True}), ("previous_response_id", {"previous_response_id": "resp_1"})]:
    try:
        client.responses.create(model="m", input="x", max_output_tokens=5, **extra)
        refused[name] = None
    except openai.BadRequestError as e:
        refused[name] = {"status": e.status_code, "param": e.param, "message": e.message}
out["refused"] = refused
print(json.dumps(out))
