#!/usr/bin/env python3
"""xtc serve beside llama.cpp's llama-server: the same client (aiperf), the
same rows, the same GGUF file, the same machine, one run each; prints a
ready-to-paste markdown table (requests done, generated tokens/s, TTFT and
inter-token latency p50 / p99, goodput at a stated SLO) with the CPU model
and the load average around each run.

    scripts/serve-side-by-side.py                 # both servers, 32 rows
    scripts/serve-side-by-side.py --requests 64 --slo-ttft-ms 5000
    scripts/serve-side-by-side.py --render OUT/xtc/aiperf OUT/llama/aiperf

What it does:
1. `xtc decode --requests N --requests-out` gives the workload's rows: the
   Azure conversation trace with `xtc decode`'s scaling on this device
   (arrival, prompt and output lengths); they become aiperf's mooncake JSONL
   (`timestamp` ms, `input_length`, `output_length`), replayed with
   `--fixed-schedule`. `xtc tokenizer export` gives aiperf the tokenizer.
2. `xtc serve` (`--max-active 32 --kv-blocks 320 --block-size 16
   --token-budget 64 --context 1024` by default), then aiperf against it
   (completions, streaming, `ignore_eos`, server token counts,
   `--goodput "time_to_first_token:T inter_token_latency:I"`); SIGTERM.
3. llama-server from scripts/peers/llama-cpp.sh's build (`--probe-only`
   builds it once and says whether the AMX trap needs `--no-repack`), with
   the same slots and KV positions (`-np 32 -c 5120 --kv-unified`, i.e.
   `--max-active` and `--kv-blocks x --block-size`), `--threads` threads;
   the same aiperf command; SIGTERM.
4. The table on stdout (markdown), JSON in OUT/side-by-side.json.

Goodput (DistServe; aiperf's `--goodput`): requests per second of the run
that met every SLO bound, here TTFT <= --slo-ttft-ms and the request's mean
inter-token latency <= --slo-itl-ms. The defaults (10 s, 0.5 s) suit a
2-core CPU device; state them beside any figure.

A loaded machine distorts both sides (llama.cpp's threads spin-wait between
operations and suffer more): the table prints the load average; measure on
a quiet machine for figures to keep. aiperf comes from --aiperf or $AIPERF
(default: aiperf on PATH), e.g. `python3 -m venv V && V/bin/pip install
aiperf`. Exit status: 0 done, 1 a server or aiperf failed, 2 bad arguments.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def say(msg):
    print(f"side-by-side: {msg}", file=sys.stderr, flush=True)


def die(msg, code=1):
    print(f"side-by-side: error: {msg}", file=sys.stderr)
    sys.exit(code)


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def load():
    return [round(x, 1) for x in os.getloadavg()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return None, b""


def wait_healthy(url, proc, limit_s=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            die(f"the server exited ({proc.returncode}) before it was ready")
        status, _ = get(url + "/health")
        if status == 200:
            return
        time.sleep(0.5)
    die(f"{url}/health not 200 after {limit_s} s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def workload(a, out):
    """The rows (xtc decode's), the mooncake JSONL and the tokenizer."""
    req = os.path.join(out, "requests.jsonl")
    with open(os.path.join(out, "decode.json"), "w") as f:
        subprocess.run([a.xtc, "decode", "--requests", str(a.requests), "--requests-out", req, "--json"],
                       stdout=f, check=True)
    rows = [json.loads(line) for line in open(req) if line.strip()]
    trace = os.path.join(out, "trace.jsonl")
    n = 0
    with open(trace, "w") as f:
        for r in rows:
            if r.get("outcome") == "rejected":
                continue
            f.write(json.dumps({"timestamp": round(r["arrival_s"] * 1000),
                                "input_length": r["prompt_tokens"],
                                "output_length": r["max_output_tokens"]}) + "\n")
            n += 1
    tok = os.path.join(out, "tokenizer")
    subprocess.run([a.xtc, "tokenizer", "export", tok], stdout=subprocess.DEVNULL, check=True)
    return trace, tok, n


def aiperf(a, url, model, trace, tok, art):
    cmd = [a.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "completions",
           "--streaming", "--input-file", trace, "--custom-dataset-type", "mooncake_trace",
           "--fixed-schedule", "--fixed-schedule-auto-offset", "--tokenizer", tok,
           "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
           "--goodput", f"time_to_first_token:{a.slo_ttft_ms:g} inter_token_latency:{a.slo_itl_ms:g}",
           "--output-artifact-dir", art]
    say("running: " + " ".join(cmd))
    with open(os.path.join(os.path.dirname(art), "aiperf.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        die(f"aiperf exited {rc} (log: {os.path.dirname(art)}/aiperf.log)")


def run_xtc(a, out, trace, tok):
    d = os.path.join(out, "xtc")
    os.makedirs(d, exist_ok=True)
    cmd = [a.xtc, "serve", "--host", "127.0.0.1", "--port", "0", "--device", a.device,
           "--max-active", str(a.max_active), "--kv-blocks", str(a.kv_blocks),
           "--block-size", str(a.block_size), "--token-budget", str(a.token_budget),
           "--context", str(a.context), "--served-model-name", "smollm2"]
    say("starting: " + " ".join(cmd))
    log = open(os.path.join(d, "server.log"), "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    url = None
    for line in p.stdout:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].strip()
            break
    if url is None:
        die(f"xtc serve exited ({p.wait()}); log: {d}/server.log")
    try:
        wait_healthy(url, p)
        side = {"server": "`xtc serve`", "command": " ".join(cmd), "load_before": load()}
        aiperf(a, url, "smollm2", trace, tok, os.path.join(d, "aiperf"))
        side["load_after"] = load()
    finally:
        stop(p)
    return side, os.path.join(d, "aiperf")


def llama_build(a):
    if a.llama_bin:
        return a.llama_bin, a.llama_repack
    out = subprocess.run(["bash", os.path.join(REPO, "scripts/peers/llama-cpp.sh"), "--probe-only",
                          "--model", a.model, "--threads", str(a.threads)],
                         stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        die("scripts/peers/llama-cpp.sh --probe-only failed")
    bin_dir, repack = out.stdout.split()
    return bin_dir, int(repack)


def run_llama(a, out, trace, tok):
    d = os.path.join(out, "llama")
    os.makedirs(d, exist_ok=True)
    bin_dir, repack = llama_build(a)
    port = free_port()
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", a.model, "-t", str(a.threads),
           "-tb", str(a.threads), "-np", str(a.max_active), "-c", str(a.kv_blocks * a.block_size),
           "--kv-unified", "--host", "127.0.0.1", "--port", str(port), "--alias", "smollm2"]
    if not repack:
        cmd.append("--no-repack")
    say("starting: " + " ".join(cmd))
    log = open(os.path.join(d, "server.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, p)
        side = {"server": "llama.cpp `llama-server`" + ("" if repack else " (`--no-repack`)"),
                "command": " ".join(cmd), "load_before": load()}
        aiperf(a, url, "smollm2", trace, tok, os.path.join(d, "aiperf"))
        side["load_after"] = load()
    finally:
        stop(p)
    return side, os.path.join(d, "aiperf")


def figures(art):
    """The table's figures from an aiperf artifact directory (or its
    profile_export_aiperf.json)."""
    path = art if art.endswith(".json") else os.path.join(art, "profile_export_aiperf.json")
    with open(path) as f:
        d = json.load(f)

    def stat(key, field="avg"):
        v = d.get(key)
        return v.get(field) if isinstance(v, dict) else None

    # aiperf: request_count is the requests that succeeded,
    # completed_request_count every request that ended (errors included).
    return {
        "requests": stat("completed_request_count") or stat("request_count"),
        "done": stat("request_count"),
        "errors": stat("error_request_count") or 0,
        "output_tokens_per_s": stat("output_token_throughput"),
        "ttft_p50_ms": stat("time_to_first_token", "p50"),
        "ttft_p99_ms": stat("time_to_first_token", "p99"),
        "itl_p50_ms": stat("inter_token_latency", "p50"),
        "itl_p99_ms": stat("inter_token_latency", "p99"),
        "goodput_rps": stat("goodput"),
        "good_requests": stat("good_request_count"),
        "duration_s": stat("benchmark_duration"),
        "aiperf": d.get("aiperf_version"),
    }


def fmt(v, digits=1):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def table(sides, slo, meta):
    lines = []
    if meta:
        lines.append(meta)
        lines.append("")
    lines.append(f"| server | requests done | generated tokens/s | TTFT p50 / p99, ms | "
                 f"inter-token p50 / p99, ms | goodput at the SLO, requests/s (good requests) |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for name, f in sides:
        total = f["requests"]
        done = f["done"]
        done_s = "-" if done is None else f"{done:.0f}" + ("" if total in (None, done) else f" of {total:.0f}")
        if f["errors"]:
            done_s += f" ({f['errors']:.0f} failed)"
        good = "" if f["good_requests"] is None else f" ({f['good_requests']:.0f})"
        lines.append(f"| {name} | {done_s} | {fmt(f['output_tokens_per_s'])} | "
                     f"{fmt(f['ttft_p50_ms'], 0)} / {fmt(f['ttft_p99_ms'], 0)} | "
                     f"{fmt(f['itl_p50_ms'], 0)} / {fmt(f['itl_p99_ms'], 0)} | "
                     f"{fmt(f['goodput_rps'], 2)}{good} |")
    lines.append("")
    lines.append(f"SLO: TTFT <= {slo[0]:g} ms and mean inter-token latency <= {slo[1]:g} ms per "
                 f"request (aiperf `--goodput`, DistServe's goodput).")
    return "\n".join(lines)


def positive(kind):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{s}' is not a number")
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{s}: must be positive")
        return v
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=positive(int), default=32, help="trace rows (default 32)")
    ap.add_argument("--out", default=os.path.join(REPO, "target/serve-side-by-side"))
    ap.add_argument("--slo-ttft-ms", type=positive(float), default=10000.0)
    ap.add_argument("--slo-itl-ms", type=positive(float), default=500.0)
    ap.add_argument("--xtc", default=os.path.join(REPO, "target/release/xtc"))
    ap.add_argument("--aiperf", default=os.environ.get("AIPERF", "aiperf"))
    ap.add_argument("--model", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "xtc/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--device", default="auto", help="xtc serve's --device (default auto)")
    ap.add_argument("--max-active", type=positive(int), default=32, help="xtc --max-active, llama -np")
    ap.add_argument("--kv-blocks", type=positive(int), default=320)
    ap.add_argument("--block-size", type=positive(int), default=16)
    ap.add_argument("--token-budget", type=positive(int), default=64)
    ap.add_argument("--context", type=positive(int), default=1024)
    ap.add_argument("--threads", type=positive(int), default=2, help="llama.cpp threads (default 2)")
    ap.add_argument("--llama-bin", help="llama-server's directory (default: the peers harness's build)")
    ap.add_argument("--llama-repack", type=int, choices=[0, 1], default=1,
                    help="with --llama-bin: 0 passes --no-repack (the AMX trap)")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-xtc", action="store_true")
    ap.add_argument("--render", nargs="+", metavar="AIPERF_DIR",
                    help="only print the table of earlier aiperf artifact directories "
                         "(the first xtc serve's, the second llama-server's)")
    a = ap.parse_args()
    slo = (a.slo_ttft_ms, a.slo_itl_ms)
    if a.render:
        if len(a.render) > 2:
            die("--render takes one or two aiperf directories", 2)
        names = ["`xtc serve`", "llama.cpp `llama-server`"]
        for p in a.render:
            if not os.path.exists(p if p.endswith(".json") else os.path.join(p, "profile_export_aiperf.json")):
                die(f"--render {p}: no profile_export_aiperf.json there", 2)
        print(table([(names[i], figures(p)) for i, p in enumerate(a.render)], slo, ""))
        return 0
    if a.skip_llama and a.skip_xtc:
        die("--skip-llama and --skip-xtc together measure nothing", 2)
    if not os.path.isfile(a.model):
        die(f"no model at {a.model}: run scripts/fetch-model.sh (or pass --model)", 2)
    if not os.access(a.xtc, os.X_OK):
        die(f"{a.xtc} is missing: cargo build --release --bin xtc (or pass --xtc)", 2)
    if shutil.which(a.aiperf) is None and not os.access(a.aiperf, os.X_OK):
        die(f"no aiperf at '{a.aiperf}': pass --aiperf or set AIPERF", 2)
    os.makedirs(a.out, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu, cores = cpu_model(), os.cpu_count()
    say(f"CPU {cpu} ({cores} cores); load average {load()}")
    trace, tok, rows = workload(a, a.out)
    say(f"{rows} rows of the trace in {trace}")
    sides = []
    if not a.skip_xtc:
        sides.append(run_xtc(a, a.out, trace, tok))
    if not a.skip_llama:
        sides.append(run_llama(a, a.out, trace, tok))
    measured = [(s["server"], figures(art)) for s, art in sides]
    loads = "; ".join(f"{s['server']}: {s['load_before']} before, {s['load_after']} after"
                      for s, _ in sides)
    meta = (f"Measured {started} on {cpu} ({cores} cores), one run each, load average "
            f"(1/5/15 min) {loads}; {rows} rows of the Azure conversation trace with `xtc decode`'s "
            f"scaling on this device, replayed by aiperf {measured[0][1]['aiperf']} "
            f"(`--fixed-schedule`, `ignore_eos`); both servers {a.max_active} slots and "
            f"{a.kv_blocks * a.block_size} KV positions, llama.cpp {a.threads} threads.")
    text = table(measured, slo, meta)
    print(text)
    with open(os.path.join(a.out, "side-by-side.json"), "w") as f:
        json.dump({"started": started, "cpu": cpu, "cores": cores, "slo_ttft_ms": slo[0],
                   "slo_itl_ms": slo[1], "rows": rows,
                   "sides": [dict(s, figures=figures(art)) for s, art in sides],
                   "markdown": text}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
