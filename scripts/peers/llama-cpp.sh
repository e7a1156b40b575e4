#!/usr/bin/env bash
# The peer harness of issue 23: builds llama.cpp (CPU backend) from the sdist
# of the Python package llama-cpp-python (it vendors llama.cpp under
# vendor/llama.cpp) and measures it beside xtc, in one run, on the same GGUF
# file and machine.
#
#   scripts/peers/llama-cpp.sh              build (once) and measure both sides
#   scripts/peers/llama-cpp.sh --build-only build (once) and stop
#   scripts/peers/llama-cpp.sh --help
#
# What it does:
# - Gets the sdist with `pip download --no-deps --no-binary :all:
#   llama-cpp-python==$PIN` (pip's configured index), unpacks it and builds
#   llama-bench, llama-batched-bench and llama-server with cmake + g++
#   (installed through apt-get when missing; needs root). The build lives in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/xtc/peers/llama.cpp-$PIN-<cpu>/ (cpu: a
#   hash of the CPU model and flags, since GGML_NATIVE builds for this CPU);
#   a second run rebuilds nothing. About 8-20 minutes on two cores.
# - AMX: a GGML_NATIVE build uses AMX tiles for batched products when the CPU
#   advertises amx_int8; on virtual machines whose hypervisor does not grant
#   the tile state that dies with SIGILL (`tileloadd`). The harness probes a
#   short batched run; on a signal it retries with `--repack 0` (llama-bench)
#   / `--no-repack` (llama-batched-bench, llama-server), and if that dies too
#   it builds a second, non-native copy without AMX (`-noamx`) and uses it.
#   The table says which way it ran.
# - Then scripts/peers/run.py runs, in one go: llama-bench (pp512, tg128,
#   2 threads), llama-batched-bench (8/16/32 sequences, 32-token prompts,
#   64 generated), then xtc's `cargo bench -p xtc-model --bench roofline`
#   and `--bench llama` (the same figures on the default Vulkan device,
#   lavapipe here, and on the CPU reference, with llama.cpp's passed in
#   through XTC_PEER_JSON), printing each figure of both sides, their ratio,
#   `lscpu`'s model name and the load average before and after; a text table
#   on stdout and JSON in target/peers/llama-cpp.json (or --json PATH).
# - llama.cpp runs with its defaults (threads spin-wait between ops): on a
#   machine shared with other work it loses far more than xtc does, so
#   figures from a loaded machine (see the load average printed) overstate
#   xtc's ratios; measure on a quiet machine.
#
# Options:
#   --pin VER       llama-cpp-python version (default: 0.3.36, PIN_DEFAULT below)
#   --model PATH    GGUF file (default: xtc's, see scripts/fetch-model.sh)
#   --threads N     llama.cpp threads (default 2)
#   --json PATH     where the JSON goes (default target/peers/llama-cpp.json)
#   --quick         shorter runs on both sides (a smoke test; figures noisy)
#   --skip-xtc      measure llama.cpp only
#   --build-only    build (or find the build) and exit
#   --probe-only    build (or find the build), run the AMX probe, print
#                   "BIN_DIR REPACK" (REPACK 0: pass --no-repack) on stdout
#                   and exit (scripts/serve-side-by-side.py uses it)
#   --no-amx        use the non-native build without AMX from the start
#   --halt-poll-ns NS  in a KVM guest with cpuidle-haltpoll, set how long an
#                   idle vCPU polls before halting (guest_halt_poll_ns) for
#                   the run, then restore it (root). Both sides run under it;
#                   the table prints the value either way. lavapipe's
#                   workers sleep between dispatches and llama.cpp's threads
#                   spin, so with 0 (halt at once) every dispatch of xtc's
#                   pays a wake-up through the hypervisor: on a 2-core
#                   Firecracker guest one stream decoded 1.3x faster at
#                   200000 (the kernel's default) than at 0.
set -euo pipefail

PIN_DEFAULT=0.3.36
pin=$PIN_DEFAULT
model=""
threads=2
json=""
quick=0
skip_xtc=0
build_only=0
probe_only=0
force_noamx=0
halt_poll=""

say() { echo "peers: $*" >&2; }
die() { echo "peers: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --pin) need_arg "$@"; pin=$2; shift 2 ;;
    --model) need_arg "$@"; model=$2; shift 2 ;;
    --threads) need_arg "$@"; threads=$2; shift 2 ;;
    --json) need_arg "$@"; json=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --skip-xtc) skip_xtc=1; shift ;;
    --build-only) build_only=1; shift ;;
    --probe-only) probe_only=1; shift ;;
    --no-amx) force_noamx=1; shift ;;
    --halt-poll-ns) need_arg "$@"; halt_poll=$2; shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $pin =~ ^[0-9]+(\.[0-9]+)*$ ]] || die "--pin wants a version like 0.3.36, not '$pin'"
[[ $threads =~ ^[1-9][0-9]*$ ]] || die "--threads wants a positive integer, not '$threads'"
[ -z "$halt_poll" ] || [[ $halt_poll =~ ^[0-9]+$ ]] || die "--halt-poll-ns wants a number of nanoseconds, not '$halt_poll'"

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/xtc/peers
cpu_key=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) | sha256sum | cut -c1-8)
base=$cache/llama.cpp-$pin-$cpu_key

if [ -z "$model" ]; then
  model=${XDG_CACHE_HOME:-$HOME/.cache}/xtc/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$model" ] || die "no model at $model: run scripts/fetch-model.sh first (or pass --model)"
fi
[ -f "$model" ] || die "--model $model: no such file"

ensure_tools() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  command -v make >/dev/null 2>&1 || missing+=(make)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
    say "installing ${missing[*]} through apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Unpacks the sdist into $base/src (once).
fetch_source() {
  if [ -f "$base/src/.complete" ]; then return; fi
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  say "downloading the llama-cpp-python $pin sdist (about 75 MB; pip prepares its metadata, a few minutes)"
  python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" "llama-cpp-python==$pin" \
    || die "pip download llama-cpp-python==$pin failed"
  local sdist
  sdist=$(ls "$tmp"/llama_cpp_python-"$pin".tar.gz 2>/dev/null | head -n1)
  [ -n "$sdist" ] || die "pip did not produce llama_cpp_python-$pin.tar.gz"
  tar -xzf "$sdist" -C "$tmp"
  [ -f "$tmp/llama_cpp_python-$pin/vendor/llama.cpp/CMakeLists.txt" ] \
    || die "the sdist has no vendor/llama.cpp"
  mkdir -p "$base"
  rm -rf "$base/src"
  mv "$tmp/llama_cpp_python-$pin/vendor/llama.cpp" "$base/src"
  touch "$base/src/.complete"
  rm -rf "$tmp"
  trap - EXIT
}

# build NAME [cmake args...]: builds the three tools into $base/NAME (once).
build() {
  local name=$1; shift
  local dir=$base/$name
  if [ -f "$dir/.complete" ]; then
    say "using the cached build $dir"
    return
  fi
  fetch_source
  say "building llama.cpp ($name) in $dir: llama-bench, llama-batched-bench, llama-server"
  cmake -S "$base/src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF -DGGML_OPENMP=OFF "$@" >"$dir.cmake.log" 2>&1 \
    || { tail -n 30 "$dir.cmake.log" >&2; die "cmake configure failed (log: $dir.cmake.log)"; }
  nice -n 10 cmake --build "$dir" -j "$(nproc)" --target llama-bench llama-batched-bench llama-server \
    >"$dir.build.log" 2>&1 \
    || { tail -n 30 "$dir.build.log" >&2; die "build failed (log: $dir.build.log)"; }
  touch "$dir/.complete"
}

ensure_tools
if [ "$force_noamx" = 1 ]; then
  flavour=noamx
else
  flavour=native
fi
noamx_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if [ "$flavour" = native ]; then build native -DGGML_NATIVE=ON; else build noamx "${noamx_args[@]}"; fi
bin=$base/$flavour/bin
[ "$build_only" = 1 ] && { say "built: $bin"; exit 0; }

# The AMX probe: a short batched run; death by a signal (SIGILL: 132) means
# the trap of issue 23.
repack=1
probe() { # probe BIN_DIR EXTRA...
  local d=$1; shift
  timeout 300 "$d/llama-batched-bench" -m "$model" -t "$threads" -c 512 -b 256 -ub 256 \
    -npp 32 -ntg 2 -npl 4 "$@" >"$base/probe.log" 2>&1
}
amx_note="no trap (batched probe ran)"
set +e
probe "$bin"; rc=$?
set -e
if [ $rc = 124 ]; then
  die "llama-batched-bench's probe ran past 300 s (log: $base/probe.log)"
elif [ $rc -ge 128 ]; then
  say "llama-batched-bench died (exit $rc, signal $((rc - 128)): the AMX SIGILL trap); retrying with --no-repack"
  set +e
  probe "$bin" --no-repack; rc2=$?
  set -e
  if [ $rc2 = 0 ]; then
    repack=0
    amx_note="batched probe died with signal $((rc - 128)); ran with --repack 0 / --no-repack"
  else
    say "still dying (exit $rc2): building without native/AMX"
    flavour=noamx
    build noamx "${noamx_args[@]}"
    bin=$base/noamx/bin
    probe "$bin" || die "the non-native build fails the probe too (log: $base/probe.log)"
    amx_note="native build died (signal $((rc - 128))) even with --no-repack; ran the non-native build without AMX"
  fi
elif [ $rc != 0 ]; then
  tail -n 20 "$base/probe.log" >&2
  die "llama-batched-bench failed its probe (exit $rc; log: $base/probe.log)"
fi
say "AMX: $amx_note"
[ "$probe_only" = 1 ] && { echo "$bin $repack"; exit 0; }

[ -n "$json" ] || json=$repo/target/peers/llama-cpp.json
args=(--bin "$bin" --model "$model" --threads "$threads" --repack "$repack" --json "$json"
  --peer-version "llama-cpp-python $pin (vendored llama.cpp, $flavour build)" --amx-note "$amx_note")
[ "$quick" = 1 ] && args+=(--quick)
[ "$skip_xtc" = 1 ] && args+=(--skip-xtc)
[ -n "$halt_poll" ] && args+=(--halt-poll-ns "$halt_poll")
exec python3 "$repo/scripts/peers/run.py" "${args[@]}"
