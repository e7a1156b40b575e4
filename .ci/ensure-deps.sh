#!/usr/bin/env bash
# Installs what xtc needs on a fresh Debian 12 machine (run as root); idempotent:
# a second run finds everything and calls no apt.
# - libvulkan1: the Vulkan loader (ash opens libvulkan.so.1 at run time);
# - mesa-vulkan-drivers: Mesa's lavapipe CPU Vulkan device, the embedded
#   default when the machine has no GPU;
# - vulkan-validationlayers: the Khronos validation layer
#   (VK_LAYER_KHRONOS_validation), which .ci/test turns on for every Vulkan
#   test, the examples and `xtc ci` (XTC_VK_VALIDATION=1);
# - gcc: the C linker rustc needs.
# Rust itself (edition 2024, rustc >= 1.88) must already be installed through
# rustup: Debian 12's own rustc (1.63) is too old, and this script does not
# download toolchains. It checks the version and says so clearly.
set -euo pipefail
need=()
# The loader is there when the dynamic linker's cache lists it (what ash's
# dlopen finds). Not `ldconfig -p | grep -q`: under pipefail grep's early exit
# kills ldconfig with SIGPIPE once its listing passes the 64 KiB pipe buffer,
# and the pipeline fails though the loader is there.
cache=$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null) || true
[[ $cache == *'libvulkan.so.1 '* ]] || need+=(libvulkan1)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
ls /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json >/dev/null 2>&1 || need+=(vulkan-validationlayers)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  echo "ensure-deps: cargo not found: install Rust >= 1.88 with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
ver=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n1.88.0\n' "$ver" | sort -V | head -n1)" != "1.88.0" ]; then
  echo "ensure-deps: rustc $ver is too old: xtc needs >= 1.88 (edition 2024); run 'rustup update stable'" >&2
  exit 1
fi
"$(dirname "$0")/../scripts/fetch-model.sh"   # the GGUF model (SmolLM2-135M-Instruct Q4_1) into ${XDG_CACHE_HOME:-$HOME/.cache}/xtc/
"$(dirname "$0")/../scripts/serve-venv.sh"    # openai + tokenizers for crates/cli/tests/serve_openai.rs
