#!/usr/bin/env bash
# Installs the Debian packages toy needs (skips those already installed).
#   scripts/deps.sh              what the build and the main job need
#   scripts/deps.sh --test       also what only the tests use (chromium for the chat page,
#                                Fashion-MNIST for the vision tests; `toy vision train --data
#                                fashion-mnist` names dataset-fashion-mnist when it is missing)
#   scripts/deps.sh --sanitize   also clang and its runtimes (the sanitizer + fuzzing build)
# Another apt or dpkg at work (unattended upgrades) is waited for, up to 10 minutes, instead
# of failing at once. See README.md for what each package is for.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libopenblas-dev libopenblas0-pthread libfmt-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libpcre2-dev libxxhash-dev libstb-dev zlib1g-dev libcpp-httplib-dev
      libopenmpi-dev openmpi-bin)
for a in "$@"; do
  case "$a" in
    --test) pkgs+=(dataset-fashion-mnist chromium) ;;
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
  wait_lock=(-o DPkg::Lock::Timeout=600)
  # (apt-get update's own lists lock is not covered by that option: retry it while busy)
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    if $sudo apt-get "${wait_lock[@]}" update -qq; then break; fi
    [ "$attempt" -lt 10 ] || exit 100
    echo "toy: apt-get update failed (another apt running?); trying again in 30 s" >&2
    sleep 30
  done
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
