#!/usr/bin/env bash
# Installs the Debian packages toy builds with (skips those already installed).
#   scripts/deps.sh              what the build and the tests need
#   scripts/deps.sh --sanitize   also clang and its runtimes (the sanitizer + fuzzing build)
# See README.md for what each one is for.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libopenblas-dev libopenblas0-pthread libfmt-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libpcre2-dev libxxhash-dev libstb-dev zlib1g-dev libcpp-httplib-dev
      dataset-fashion-mnist chromium)
for a in "$@"; do
  case "$a" in
    --sanitize) pkgs+=(clang libclang-rt-dev) ;;
    *) echo "scripts/deps.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "toy: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
