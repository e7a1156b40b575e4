#!/usr/bin/env python3
"""The measuring half of scripts/peers/llama-cpp.sh (issue 23): llama.cpp's
llama-bench and llama-batched-bench, then xtc's `--bench roofline` and
`--bench llama` (Vulkan and the CPU reference), on one GGUF file and machine,
in one run; prints a table of both sides and their ratios, the CPU model and
the load average before and after, and writes JSON.

Called by llama-cpp.sh (which builds llama.cpp and picks --repack); run it
directly only with a built llama.cpp: `run.py --bin DIR --model FILE`.
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def say(msg):
    print(f"peers: {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"peers: error: {msg}", file=sys.stderr)
    sys.exit(2)


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def load():
    return [round(x, 2) for x in os.getloadavg()]


HALT_POLL = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def idle_state():
    """How this machine's idle CPUs wait: the cpuidle driver and, in a KVM
    guest with cpuidle-haltpoll, how long an idle vCPU polls before it halts.
    It matters to the two sides differently: llama.cpp's threads spin-wait
    between ops in user space, while lavapipe's workers sleep between
    dispatches, and a sleeping worker on a halted vCPU is woken through the
    hypervisor (tens of microseconds, about 150 times a token)."""
    return {"cpuidle_driver": read_text("/sys/devices/system/cpu/cpuidle/current_driver"),
            "guest_halt_poll_ns": read_text(HALT_POLL)}


class HaltPoll:
    """Sets guest_halt_poll_ns for the run (--halt-poll-ns; root) and puts
    the old value back at the end, whatever happens."""

    def __init__(self, ns):
        self.ns, self.old = ns, None

    def __enter__(self):
        if self.ns is None:
            return self
        self.old = read_text(HALT_POLL)
        if self.old is None:
            die(f"--halt-poll-ns: {HALT_POLL} is missing (not a KVM guest with cpuidle-haltpoll)")
        try:
            with open(HALT_POLL, "w") as f:
                f.write(str(self.ns))
        except OSError as e:
            die(f"--halt-poll-ns: cannot write {HALT_POLL} ({e}; it needs root)")
        say(f"guest_halt_poll_ns {self.old} -> {self.ns} for this run")
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            with open(HALT_POLL, "w") as f:
                f.write(self.old)
            say(f"guest_halt_poll_ns back to {self.old}")
        return False


def run(cmd, env=None, echo=False):
    say("running: " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if echo:
            sys.stderr.write(line)
    rc = p.wait()
    out = "".join(lines)
    if rc != 0:
        sys.stderr.write(out[-4000:])
        die(f"{cmd[0]} exited {rc}")
    say(f"  took {time.time() - t0:.0f} s")
    return out


def llama_cpp(a):
    repack = [] if a.repack else ["--repack", "0"]
    no_repack = [] if a.repack else ["--no-repack"]
    reps = "1" if a.quick else "3"
    out = run([f"{a.bin}/llama-bench", "-m", a.model, "-t", str(a.threads), "-p", "512",
               "-n", "128", "-r", reps, "-o", "json"] + repack)
    rows = json.loads(out[out.index("["):out.rindex("]") + 1])
    fig = {}
    for r in rows:
        if r.get("n_prompt") == 512 and r.get("n_gen") == 0:
            fig["pp512"] = r["avg_ts"]
        elif r.get("n_gen") == 128 and r.get("n_prompt") == 0:
            fig["tg128"] = r["avg_ts"]
    ntg = "16" if a.quick else "64"
    out = run([f"{a.bin}/llama-batched-bench", "-m", a.model, "-t", str(a.threads),
               "-tb", str(a.threads), "-c", "4096", "-npp", "32", "-ntg", ntg,
               "-npl", "8,16,32", "--output-format", "jsonl"] + no_repack)
    agg = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            r = json.loads(line)
            agg[str(r["pl"])] = r["speed_tg"]
    fig["agg"] = agg
    if "pp512" not in fig or "tg128" not in fig or len(agg) != 3:
        die(f"could not read llama.cpp's figures: {fig}")
    return fig


def handoff_ceiling(xtc, peer_tg):
    """The one-stream rate that the Vulkan side's dispatch groups alone allow:
    from `--bench llama`'s one-member profile, every barrier-separated group
    takes at least the fastest group's device time (its fixed cost: the
    hand-off to lavapipe's workers and back, plus that group's own small
    work), so groups x fastest group bounds a token's time from below
    whatever the kernels do (loose where the profile has persistent chains,
    each one group holding many: `chained`). None without such a profile."""
    if not xtc:
        return None
    for side in xtc.get("sides", []):
        for p in side.get("profiles") or []:
            if p.get("members") == 1 and p.get("groups_per_iteration") and p.get("fastest_group_us"):
                floor_ms = p["groups_per_iteration"] * p["fastest_group_us"] / 1e3
                tps = 1e3 / floor_ms
                return {"groups": p["groups_per_iteration"], "fastest_group_us": p["fastest_group_us"],
                        "floor_ms": floor_ms, "tokens_per_s": tps, "ratio": tps / peer_tg,
                        "chained": bool(p.get("chained"))}
    return None


def cargo_bench(name, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    return run(["nice", "-n", "0", "cargo", "bench", "--quiet", "-p", "xtc-model", "--bench", name],
               env=env, echo=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory holding llama-bench and llama-batched-bench")
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repack", type=int, choices=[0, 1], default=1,
                    help="0: run llama.cpp with --repack 0 / --no-repack (the AMX trap)")
    ap.add_argument("--json", default=os.path.join(REPO, "target/peers/llama-cpp.json"))
    ap.add_argument("--peer-version", default="llama.cpp")
    ap.add_argument("--amx-note", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-xtc", action="store_true")
    ap.add_argument("--halt-poll-ns", type=int, default=None,
                    help="set the KVM guest's halt polling (guest_halt_poll_ns) for the run and "
                         "restore it after (root; the kernel's own default is 200000)")
    a = ap.parse_args()
    if a.halt_poll_ns is not None and not 0 <= a.halt_poll_ns <= 10_000_000:
        die(f"--halt-poll-ns wants 0 to 10000000, not {a.halt_poll_ns}")
    for tool in ("llama-bench", "llama-batched-bench"):
        if not os.access(os.path.join(a.bin, tool), os.X_OK):
            die(f"{a.bin}/{tool} is missing: build it with scripts/peers/llama-cpp.sh --build-only")
    if not os.path.isfile(a.model):
        die(f"no model at {a.model}")
    with HaltPoll(a.halt_poll_ns):
        measure(a)


def measure(a):
    outdir = os.path.dirname(os.path.abspath(a.json))
    os.makedirs(outdir, exist_ok=True)

    report = {"cpu": cpu_model(), "nproc": os.cpu_count(), "threads": a.threads,
              "model": a.model, "peer": a.peer_version, "amx": a.amx_note,
              "quick": a.quick, "load_before": load(), "idle": idle_state(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    say(f"CPU {report['cpu']}; load average before {report['load_before']}")

    peer = llama_cpp(a)
    peer["label"] = f"{a.peer_version}, CPU backend, {a.threads} threads"
    report["llama_cpp"] = peer
    peer_json = os.path.join(outdir, "peer.json")
    with open(peer_json, "w") as f:
        json.dump(peer, f, indent=1)
    report["load_mid"] = load()

    sides = {}
    if not a.skip_xtc:
        roof_json = os.path.join(outdir, "roofline.json")
        extra = {"XTC_BENCH_JSON": roof_json}
        if a.quick:
            extra["XTC_BENCH_QUICK"] = "1"
        cargo_bench("roofline", extra)
        with open(roof_json) as f:
            report["roofline"] = json.load(f)
        xtc_json = os.path.join(outdir, "xtc.json")
        extra = {"XTC_PEER_JSON": peer_json, "XTC_ROOFLINE_JSON": roof_json,
                 "XTC_BENCH_JSON": xtc_json}
        if a.quick:
            extra["XTC_BENCH_QUICK"] = "1"
        cargo_bench("llama", extra)
        with open(xtc_json) as f:
            x = json.load(f)
        report["xtc"] = x
        for s in x["sides"]:
            sides[s["side"]] = {r["key"]: r["tokens_per_s"] for r in s["rows"]}
    report["load_after"] = load()

    figs = [("pp512", "pp512 tokens/s (1 sequence)"), ("tg128", "tg128 tokens/s (1 stream)")]
    figs += [(f"agg{n}", f"{n} sequences, aggregate tg tokens/s") for n in (8, 16, 32)]

    def peer_fig(k):
        return peer["agg"][k[3:]] if k.startswith("agg") else peer[k]

    cols = [s for s in ("vulkan", "cpu-reference") if s in sides]
    print()
    print(f"Beside llama.cpp: {report['peer']}; model {os.path.basename(a.model)}")
    print(f"CPU: {report['cpu']} ({report['nproc']} cores); llama.cpp threads {a.threads}; AMX: {a.amx_note}")
    idle = report["idle"]
    print(f"idle CPUs: cpuidle driver {idle['cpuidle_driver'] or 'none'}, guest_halt_poll_ns "
          f"{idle['guest_halt_poll_ns'] if idle['guest_halt_poll_ns'] is not None else 'n/a'}"
          " (lavapipe's workers sleep between dispatches; llama.cpp's spin)")
    print(f"load average (1/5/15 min): before {report['load_before']}, after llama.cpp "
          f"{report['load_mid']}, after xtc {report['load_after']}")
    hdr = f"{'figure':<38} {'llama.cpp':>10}"
    for c in cols:
        hdr += f" {'xtc ' + c:>20} {'ratio':>7}"
    print(hdr)
    table = []
    for k, name in figs:
        p = peer_fig(k)
        line = f"{name:<38} {p:>10.1f}"
        row = {"figure": k, "llama_cpp": p}
        for c in cols:
            v = sides[c].get(k)
            if v is None:
                line += f" {'-':>20} {'-':>7}"
                continue
            line += f" {v:>20.1f} {v / p:>6.2f}x"
            row[c] = v
            row[c + "_ratio"] = v / p
        print(line)
        table.append(row)
    report["table"] = table
    ceil = handoff_ceiling(report.get("xtc"), peer["tg128"])
    if ceil is not None:
        report["one_stream_ceiling"] = ceil
        print(f"one stream, ceiling from dispatch groups alone: {ceil['groups']} groups x fastest group "
              f"{ceil['fastest_group_us']:.1f} us = {ceil['floor_ms']:.2f} ms a token -> at most "
              f"{ceil['tokens_per_s']:.1f} tokens/s, {ceil['ratio']:.2f}x llama.cpp's tg128 "
              "(every group takes at least the fastest one's time, whatever its kernels do"
              + ("; persistent chains count as one group each, so this bound is loose)" if ceil["chained"]
                 else ")"))
    if "roofline" in report:
        r = report["roofline"]
        print(f"roofline ({r.get('path', '?')}): triad {r['triad_gbs']:.1f} GB/s, f32 FMA "
              f"{r['f32_fma_gflops']:.1f} GFLOP/s, int8 multiply-add {r['int8_gops']:.1f} GOP/s")
        d = r.get("device")
        if d:
            print(f"device ceiling ({d['name']}): f32 multiply-add {d['f32_gflops']:.1f} GFLOP/s "
                  f"({100 * d['f32_fraction_of_fma_peak']:.1f}% of the FMA peak), fma builtin "
                  f"{d['f32_fma_gflops']:.1f}, i32 multiply-add {d['i32_gops']:.1f} GOP/s")
    print("(a shared machine: rates are noisy, ratios measured side by side are the figures to read)")
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"JSON: {a.json}")


if __name__ == "__main__":
    main()
