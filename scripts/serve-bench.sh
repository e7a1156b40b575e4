#!/usr/bin/env bash
# Drives an OpenAI-compatible server with aiperf (NVIDIA's load generator) on
# the workload `xtc decode` replays: the same Azure conversation-trace rows and
# the same scaling (prompt and output divisors, time scale) as `xtc decode` on
# this device, so the served figures sit beside the in-process ones.
#
#   scripts/serve-bench.sh URL [REQUESTS] [OUT_DIR] [-- extra aiperf args]
#
# 1. `xtc decode --requests N --requests-out` writes the workload's rows
#    (arrival, prompt and output lengths) and the in-process figures;
# 2. the rows become aiperf's mooncake JSONL (`timestamp` ms, `input_length`,
#    `output_length`), replayed with --fixed-schedule;
# 3. `xtc tokenizer export` gives aiperf the model's tokenizer offline;
# 4. aiperf profiles URL (completions, streaming, ignore_eos so every request
#    generates its trace length, goodput at the SLO TTFT <= $SLO_TTFT_MS
#    (10000) and mean inter-token latency <= $SLO_ITL_MS (500) ms); its
#    artifacts go to OUT_DIR/aiperf.
# scripts/serve-side-by-side.py runs this against xtc serve and llama-server
# in one go and prints both as one markdown table.
# The same command drives llama.cpp's llama-server or any other server of the
# same model: only URL changes.
#
# aiperf comes from $AIPERF (default: aiperf on PATH), e.g. a virtual
# environment made with `python3 -m venv V && V/bin/pip install aiperf`.
set -euo pipefail
url=${1:?usage: serve-bench.sh URL [REQUESTS] [OUT_DIR] [-- aiperf args]}
n=${2:-32}
out=${3:-target/serve-bench}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
xtc=${XTC:-target/release/xtc}
aiperf=${AIPERF:-aiperf}
mkdir -p "$out"
"$xtc" decode --requests "$n" --requests-out "$out/requests.jsonl" --json > "$out/decode.json"
python3 - "$out/requests.jsonl" "$out/trace.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    for r in rows:
        if r.get("outcome") == "rejected":
            continue
        f.write(json.dumps({"timestamp": round(r["arrival_s"] * 1000),
                            "input_length": r["prompt_tokens"],
                            "output_length": r["max_output_tokens"]}) + "\n")
PY
"$xtc" tokenizer export "$out/tokenizer" >/dev/null
model=$(curl -s "$url/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
"$aiperf" profile --model "$model" --url "$url" --endpoint-type completions --streaming \
  --input-file "$out/trace.jsonl" --custom-dataset-type mooncake_trace --fixed-schedule \
  --fixed-schedule-auto-offset --tokenizer "$out/tokenizer" \
  --extra-inputs ignore_eos:true --use-server-token-count \
  --goodput "time_to_first_token:${SLO_TTFT_MS:-10000} inter_token_latency:${SLO_ITL_MS:-500}" \
  --output-artifact-dir "$out/aiperf" "$@"
python3 - "$out/decode.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, k):
    if isinstance(o, dict):
        if k in o and isinstance(o[k], (int, float)): return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, k)
            if r is not None: return r
print("xtc decode in process, same rows:", find(d, "output_tokens_per_s"), "generated tokens/s")
PY
