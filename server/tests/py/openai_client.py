"""Drives llm-server with the official `openai` SDK: model list, chat (plain and streamed),
completions (plain and streamed), an SDK-raised 400. Prints one JSON object of findings for the
Rust test to check; any failed expectation raises here.

usage: openai_client.py BASE_URL API_KEY
"""
import json
import sys

import openai
from openai import OpenAI

base_url, api_key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
out = {"sdk_version": openai.__version__}

models = client.models.list()
ids = [m.id for m in models.data]
assert len(ids) == 1, ids
model = ids[0]
out["model"] = model

messages = [{"role": "user", "content": "What is the capital of France?"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0)
choice = chat.choices[0]
assert chat.object == "chat.completion", chat
assert choice.message.role == "assistant"
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert chat.usage.completion_tokens <= 5 and chat.usage.prompt_tokens > 0, chat.usage
out["chat"] = {"content": choice.message.content, "finish_reason": choice.finish_reason,
               "usage": chat.usage.model_dump()}

stream = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
assert usage is not None, "no usage chunk with include_usage"
out["chat_stream"] = {"content": "".join(pieces), "finish_reason": finish, "usage": usage.model_dump()}

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                       temperature=0)
assert completion.object == "text_completion"
out["completion"] = {"text": completion.choices[0].text,
                     "finish_reason": completion.choices[0].finish_reason,
                     "usage": completion.usage.model_dump()}

stream = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                   temperature=0, stream=True)
out["completion_stream"] = {"text": "".join(c.choices[0].text for c in stream if c.choices)}

try:
    client.chat.completions.create(model=model, messages=messages, n=2)
    raise AssertionError("n=2 was accepted")
except openai.BadRequestError as e:
    out["n2_error"] = {"status": e.status_code, "message": e.message}

print(json.dumps(out))
