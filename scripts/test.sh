#!/usr/bin/env bash
# Builds toy and runs the whole test suite (fast and slow labels). When Node.js is present it
# first installs llama.cpp from npm (tools/llamacpp: node-llama-cpp, pinned), the oracle the
# tests/llamacpp tests run our GGUF files in.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
if command -v npm >/dev/null 2>&1; then
  lock=tools/llamacpp/package-lock.json stamp=tools/llamacpp/node_modules/.toy-installed
  if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
    (cd tools/llamacpp && npm ci --no-audit --no-fund --loglevel=error >/dev/null) && touch "$stamp"
  fi
else
  echo "toy: no Node.js/npm: the llama.cpp oracle tests will skip (CI=true makes them fail)" >&2
fi
ctest --test-dir build --output-on-failure -j2 "$@"
