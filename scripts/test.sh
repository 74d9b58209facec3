#!/usr/bin/env bash
# Builds toy and runs the whole test suite (fast and slow labels). When Node.js is present it
# first installs, from npm and pinned, llama.cpp (tools/llamacpp: node-llama-cpp), the oracle
# the tests/llamacpp tests run our GGUF files in, and the real clients of toy serve's tests
# (tools/serve-clients: the openai SDK, puppeteer-core for the chat page in chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test  # (what only the tests use: chromium, Fashion-MNIST)
scripts/build.sh
if command -v npm >/dev/null 2>&1; then
  for dir in tools/llamacpp tools/serve-clients; do
    lock=$dir/package-lock.json stamp=$dir/node_modules/.toy-installed
    if [ ! -f "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) && touch "$stamp"
    fi
  done
else
  echo "toy: no Node.js/npm: the llama.cpp oracle and serve-client tests will skip (CI=true makes them fail)" >&2
fi
ctest --test-dir build --output-on-failure -j2 "$@"
