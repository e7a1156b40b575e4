"""Conformance of `xtc serve` with the official `openai` Python client
(max_retries=0, so a refusal is seen as it is), and of `xtc tokenizer
export` with the `tokenizers` package. Run by tests/serve_openai.rs:

    python serve_openai_client.py URL TOKENIZER_DIR TEXT_FILE
"""

import json
import random
import sys
import urllib.request

import openai
import tokenizers

url, tok_dir, text_file = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
assert MODEL == "smollm2-135m-instruct", MODEL

# Completions, whole and streamed with usage.
c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6)
assert "Paris" in c.choices[0].text, c
assert c.choices[0].finish_reason == "length"
assert c.usage.completion_tokens == 6 and c.usage.prompt_tokens == 5, c.usage
chunks = list(
    client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6,
        stream=True, stream_options={"include_usage": True},
    )
)
assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
ids = client.completions.create(model=MODEL, prompt=[504, 3575, 282, 4649, 314], max_tokens=6)
assert ids.choices[0].text == c.choices[0].text, ids

# Chat, whole and streamed.
msgs = [{"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30)
assert "Paris" in r.choices[0].message.content, r
assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
s = client.chat.completions.create(
    model=MODEL, messages=msgs, max_tokens=30, stream=True, stream_options={"include_usage": True}
)
parts, usage, finish = [], None, None
for ch in s:
    if ch.usage:
        usage = ch.usage
    for choice in ch.choices:
        parts.append(choice.delta.content or "")
        finish = choice.finish_reason or finish
assert "".join(parts) == r.choices[0].message.content, parts
assert finish == "stop" and usage.completion_tokens == r.usage.completion_tokens

# Seeded sampling through the client's own fields.
a = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0.9, top_p=0.9, seed=5)
b = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0.9, top_p=0.9, seed=5)
assert a.choices[0].text == b.choices[0].text

# Errors raise the client's exception types.
def raises(exc, fn, check=None):
    try:
        fn()
    except exc as e:
        if check:
            check(e)
        return
    raise AssertionError(f"expected {exc.__name__}")

raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="a", n=2),
       lambda e: e.body and e.body.get("param") == "n")
raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="a", max_tokens=10**12),
       lambda e: e.code == "context_length_exceeded")
raises(openai.BadRequestError, lambda: client.chat.completions.create(
    model=MODEL, messages=msgs, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]))
raises(openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt="a", max_tokens=1))
raises(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt="a", logprobs=2))

# The exported tokenizer agrees with the server's /tokenize on 100 strings.
tok = tokenizers.Tokenizer.from_file(tok_dir + "/tokenizer.json")
json.load(open(tok_dir + "/tokenizer_config.json"))
text = open(text_file, encoding="utf-8").read()
rng = random.Random(1)
samples = ["Hello world", "  leading spaces", "numbers 12345 and 3.14", "emoji 🦀 and CJK 中文字符",
           "<|im_start|>user\nHi<|im_end|>\n", "tabs\tand\nnewlines\n\n", "don't won't I'm", "ÀÉÎõü ß"]
while len(samples) < 100:
    i = rng.randrange(len(text) - 300)
    samples.append(text[i : i + rng.randrange(1, 300)])
for s in samples:
    req = urllib.request.Request(url + "/tokenize", data=json.dumps({"prompt": s}).encode(),
                                 headers={"content-type": "application/json"})
    want = json.load(urllib.request.urlopen(req))["tokens"]
    got = tok.encode(s, add_special_tokens=False).ids
    assert got == want, (s, got, want)
    assert tok.decode(want, skip_special_tokens=False) == s, s
print("ok: openai client conformance, 100 tokenizer strings")
