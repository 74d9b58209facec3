#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/) for SECONDS each (default 60), one after the other, in
# the clang AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/, configured and
# built here when needed; it is also the build CI runs the fast tests in).
#
#   scripts/fuzz.sh [SECONDS]
#
# Prints one line per target, "TARGET execs=N findings=M", and exits non-zero on any finding.
# Each target's corpus grows in build-asan/fuzz-work/corpus/TARGET (kept between runs), seeded
# from fuzz/seeds/TARGET, fuzz/regressions/TARGET and, for gguf_vocab, ../shared/data/vocab.
# An input that crashes (or leaks, hangs, or runs away with memory) is copied to
# fuzz/regressions/TARGET/: commit it with the fix — ctest runs every target over its
# regressions, so the bug stays fixed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS]  (SECONDS: a positive integer, per target)" >&2
  exit 2
fi
build=${TOY_ASAN_BUILD:-$root/build-asan}
# Every fuzz/fuzz_*.cpp is a target (fuzz/CMakeLists.txt builds them all).
targets=()
for f in "$root"/fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done

"$root/scripts/deps.sh" --sanitize >&2 || exit 2
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DTOY_SANITIZE=address,undefined -DTOY_FUZZ=ON -DTOY_CUDA=OFF >/dev/null || exit 2
fi
fuzzers=()
for t in "${targets[@]}"; do fuzzers+=("fuzz_$t"); done
cmake --build "$build" --target "${fuzzers[@]}" >&2 || exit 2

work="$build/fuzz-work"
total=0
status=0
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t" findings="$work/findings/$t" log="$work/$t.log"
  mkdir -p "$corpus" "$findings"
  rm -f "$findings"/*
  seeds=("$root/fuzz/seeds/$t")
  [ -d "$root/fuzz/regressions/$t" ] && seeds+=("$root/fuzz/regressions/$t")
  if [ "$t" = gguf_vocab ] && [ -d "$root/../shared/data/vocab" ]; then seeds+=("$root/../shared/data/vocab"); fi
  # Leaks, sanitizer reports, timeouts (10 s per input) and >2 GiB of memory are findings.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/fuzz_$t" "$corpus" "${seeds[@]}" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$findings/" -timeout=10 -rss_limit_mb=2048 -max_len=65536 >"$log" 2>&1
  rc=$?
  # Executions: the final stats, or the last status line ("#N ...") when it stopped on a finding.
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -n 1)
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tr -d '#' | sort -n | tail -n 1)
  execs=${execs:-0}
  n=$(find "$findings" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then n=1; fi  # died without an artifact: still a finding
  if [ "$n" -gt 0 ]; then
    mkdir -p "$root/fuzz/regressions/$t"
    cp "$findings"/* "$root/fuzz/regressions/$t/" 2>/dev/null
    echo "fuzz: $t: see $log; the inputs are in fuzz/regressions/$t/" >&2
    status=1
  fi
  total=$((total + execs))
  echo "$t execs=$execs findings=$n"
done
echo "fuzz: $total executions in all" >&2
exit $status
