"""Issue 44's "Done when" for constrained output: a JSON schema of integer, number and string
fields without bounds, at temperature 0.7 on several seeds, through the official `openai` SDK
(chat and completions). Each answer must be JSON valid against the schema within 120 tokens.
Prints one JSON object with every result; the Rust test asserts on it."""

import json
import sys

import jsonschema
import openai

base, = sys.argv[1:]
client = openai.OpenAI(base_url=base, api_key="none")

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"},
    "population": {"type": "integer"},
    "area_km2": {"type": "number"}},
    "required": ["city", "population", "area_km2"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
PROMPT = "Give the name, population and area of a large city as JSON."


def check(content):
    try:
        jsonschema.validate(json.loads(content), SCHEMA)
        return None
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"[:300]


results = []
for seed in range(6):
    if seed % 2 == 0:
        c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=120, temperature=0.7, seed=seed, response_format=FORMAT)
        text, finish, endpoint = c.choices[0].message.content, c.choices[0].finish_reason, "chat"
    else:
        c = client.completions.create(model="m", prompt=PROMPT + "\nJSON:", max_tokens=120, temperature=0.7,
                                      seed=seed, extra_body={"response_format": FORMAT})
        text, finish, endpoint = c.choices[0].text, c.choices[0].finish_reason, "completions"
    results.append({"seed": seed, "endpoint": endpoint, "content": text, "finish": finish,
                    "completion_tokens": c.usage.completion_tokens, "error": check(text)})
print(json.dumps({"results": results}))
