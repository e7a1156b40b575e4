#!/usr/bin/env python3
"""Replay an `xtc decode` workload against an OpenAI-compatible server.

Reads the per-request records `xtc decode --requests-out FILE` wrote
(arrival, prompt and output lengths: the Azure trace rows with the same
scaling as that run), sends each request at its arrival time to
`POST /v1/completions` as a token-id prompt of the same length (windows of
a text tokenized by the server's `/tokenize`), `max_tokens` = the output
length with `ignore_eos` (so every request generates exactly what the
in-process run generated), streamed, and prints the served figures beside
what the same workload gave in process:

    xtc decode --requests-out req.json --json > decode.json
    xtc serve --port 8000 --max-active 32 --kv-blocks N ... &
    scripts/serve-replay.py --url http://127.0.0.1:8000 --requests req.json \
        --decode-report decode.json

Standard library only (a cheap cross-check of any load client's figures).
"""

import argparse
import json
import math
import sys
import threading
import time
import urllib.request


def load_records(path):
    text = open(path, encoding="utf-8").read().strip()
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:  # JSON Lines, one record a line
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(rows, dict):
        rows = rows.get("requests", [])
    return [r for r in rows if r.get("outcome", "done") != "rejected"]


def post(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    return urllib.request.urlopen(req, timeout=3600)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--requests", required=True, help="xtc decode --requests-out file")
    ap.add_argument("--decode-report", help="xtc decode --json output, for the ratio")
    ap.add_argument("--text", default="data/pride_and_prejudice_ch1-12.txt")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()

    rows = load_records(a.requests)
    corpus = json.load(post(a.url + "/tokenize", {"prompt": open(a.text, encoding="utf-8").read()}))["tokens"]
    results = [None] * len(rows)

    def one(i, r, t0):
        n_in = int(r["prompt_tokens"])
        n_out = int(r.get("max_output_tokens") or r["output_tokens"])
        off = (i * 7919) % max(1, len(corpus) - n_in)
        body = {
            "prompt": corpus[off : off + n_in],
            "max_tokens": n_out,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        delay = t0 + float(r["arrival_s"]) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sent = time.monotonic()
        first, stamps, tokens, status = None, [], 0, "done"
        try:
            with post(a.url + "/v1/completions", body) as resp:
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    ev = json.loads(data)
                    if "error" in ev:
                        status = "error"
                        break
                    now = time.monotonic()
                    if ev.get("choices") and ev["choices"][0].get("text"):
                        first = first or now
                        stamps.append(now)
                    if ev.get("usage"):
                        tokens = ev["usage"]["completion_tokens"]
        except Exception as e:  # noqa: BLE001 - every failure is counted
            status = f"error: {e}"
        end = time.monotonic()
        results[i] = dict(status=status, sent=sent, first=first, end=end, tokens=tokens, stamps=stamps)

    t0 = time.monotonic() + 0.5
    threads = [threading.Thread(target=one, args=(i, r, t0)) for i, r in enumerate(rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in results if r and r["status"] == "done"]
    start = min(r["sent"] for r in results)
    wall = max(r["end"] for r in results) - start
    gen = sum(r["tokens"] for r in done)
    ttft = [(r["first"] - r["sent"]) * 1e3 for r in done if r["first"]]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r["stamps"], r["stamps"][1:])]
    out = {
        "requests": len(rows),
        "done": len(done),
        "generated_tokens": gen,
        "wall_s": wall,
        "generated_tokens_per_s": gen / wall if wall > 0 else 0.0,
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "itl_ms_p50": pct(itl, 50),
        "itl_ms_p99": pct(itl, 99),
    }
    if a.decode_report:
        rep = json.load(open(a.decode_report, encoding="utf-8"))
        ref = find_key(rep, "output_tokens_per_s")
        if ref:
            out["decode_generated_tokens_per_s"] = ref
            out["ratio"] = out["generated_tokens_per_s"] / ref
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:32} {v:.3f}" if isinstance(v, float) else f"{k:32} {v}")
    return 0 if len(done) == len(rows) else 1


def find_key(obj, key):
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], (int, float)):
            return obj[key]
        for v in obj.values():
            r = find_key(v, key)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


if __name__ == "__main__":
    sys.exit(main())
