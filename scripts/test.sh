#!/usr/bin/env bash
# Builds toy and runs the whole test suite (fast and slow labels).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j2 "$@"
