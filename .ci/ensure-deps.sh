#!/usr/bin/env bash
# Installs what xtc needs on a fresh Debian 12 machine (run as root); idempotent.
# - libvulkan1 + mesa-vulkan-drivers: the Vulkan loader and Mesa's lavapipe CPU
#   device, the embedded default when no GPU is present.
# - a Rust toolchain when cargo is missing (through rustup from Debian's packages
#   is not enough for edition 2024, so we use the machine's toolchain if any).
set -euo pipefail
need=()
[ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/libvulkan.so.1 ] || need+=(libvulkan1)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "ensure-deps: cargo not found; install Rust (rustup) first" >&2; exit 1; }
