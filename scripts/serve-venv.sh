#!/usr/bin/env bash
# A Python virtual environment for the `xtc serve` client tests
# (crates/cli/tests/serve_openai.rs): the official `openai` client (conformance) and
# `tokenizers` (checks `xtc tokenizer export` against the server's /tokenize).
# Idempotent: an environment that already imports both is kept.
# Path: ${XTC_SERVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xtc/venv-serve}.
set -euo pipefail
venv="${XTC_SERVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/xtc/venv-serve}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import openai, tokenizers' 2>/dev/null; then
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
  echo "serve-venv: installing python3-venv" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q 'openai==3.60.0' 'tokenizers==0.23.3'
echo "serve-venv: $venv ready" >&2
