#!/usr/bin/env python3
"""A llama.cpp golden of whole chat transcripts, in testdata/README.md's JSON layout.

    bench/golden_chat.py MODEL CASES.json OUT.golden.json

CASES holds `tokenize` texts and `chats` (name + OpenAI-style messages). Each chat is rendered
with the model's own `tokenizer.chat_template` (generation prompt added), or CASES' `template`
for a model without one (a base model read in its family's turn format), evaluated by llama.cpp
(llama-cpp-python, 1 thread, n_ctx 1024, n_batch 512, the golden files' settings): the greedy
continuation (prompt in one batch, then one token at a time, until an end-of-generation token or
`n_predict`), then the top logits at every position of prompt + greedy minus its last token, fed
in one batch. Run it from the peer's virtualenv (testdata/README.md).
"""
import json
import sys

import jinja2
import llama_cpp
import numpy as np


def main():
    model, cases_path, out_path = sys.argv[1:4]
    cases = json.load(open(cases_path))
    top_k, n_predict = cases["top_k"], cases["n_predict"]
    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=True,
                          verbose=False, n_threads=1)
    vocab = llm._model.vocab
    source = llm.metadata.get("tokenizer.chat_template") or cases["template"]
    template = jinja2.Environment().from_string(source)
    tok = lambda text: llm.tokenize(text.encode(), add_bos=True, special=True)
    golden = {
        "model": model.rsplit("/", 1)[-1],
        "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, x86-64-v3 build)",
        "n_vocab": llm.n_vocab(),
        "tokenize": [{"text": t, "ids": tok(t)} for t in cases["tokenize"]],
        "prompts": [],
    }
    for chat in cases["chats"]:
        text = template.render(messages=chat["messages"], add_generation_prompt=True)
        prompt = tok(text)
        llm.reset()
        llm.eval(prompt)
        greedy = []
        while len(greedy) < n_predict:
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            greedy.append(t)
            if llama_cpp.llama_vocab_is_eog(vocab, t):
                break
            llm.eval([t])
        fed = prompt + greedy[:-1]
        llm.reset()
        llm.eval(fed)
        top = []
        for i in range(len(fed)):
            row = llm.scores[i]
            ids = np.argsort(-row, kind="stable")[:top_k]
            top.append([[int(j), float(row[j])] for j in ids])
        golden["prompts"].append({
            "name": chat["name"],
            "prompt_text": text,
            "prompt_tokens": prompt,
            "greedy_tokens": greedy,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
            "teacher_forced_top": top,
        })
        print(f"{chat['name']}: {len(prompt)} prompt tokens, greedy {golden['prompts'][-1]['greedy_text']!r}",
              file=sys.stderr)
    with open(out_path, "w") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
