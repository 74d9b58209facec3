#!/usr/bin/env bash
# The CUDA backend's proof on a lent GPU machine (the `device` tool's `run`), and its
# preparation here.
#   scripts/gpu-check.sh --bundle    here: pack build/toy, build/tests/toy_gpu_tests and the
#                                    non-system libraries they need into gpu-bundle.tar.gz
#                                    (the run tool carries at most 64 MiB)
#   scripts/gpu-check.sh --dry-run   here: make the bundle and check it (size, ldd closure:
#                                    only libcuda, cuBLAS and NCCL may be missing, as the GPU
#                                    machine has them in its PyTorch's pip packages); prints
#                                    the JSON with "measured": false
#   scripts/gpu-check.sh             there (`run` with carry ["gpu-bundle.tar.gz"], timeout_s
#                                    about 420): unpack, find cuBLAS/NCCL in the pip packages,
#                                    run the GPU tests with TOY_REQUIRE_GPU=1, each stage under
#                                    its own timeout; logs under $OUT
# The last line is one JSON object: tests_passed, tests_failed, tests_skipped, measured, gpu,
# driver, commit, train_tokens_per_s, mfu, peak_bytes, decode_tokens_per_s, stage_seconds
# (null where a stage does not exist yet: the training and decoding benchmarks come with the
# kernels they need).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
bundle=gpu-bundle.tar.gz
out=${OUT:-/tmp/toy-gpu-check}
mkdir -p "$out"
declare -A stage_s
json() {  # measured passed failed skipped gpu driver
  local stages="{" k sep=""
  for k in "${!stage_s[@]}"; do stages+="$sep\"$k\": ${stage_s[$k]}"; sep=", "; done
  stages+="}"
  printf '{"measured": %s, "tests_passed": %s, "tests_failed": %s, "tests_skipped": %s, "gpu": %s, "driver": %s, "commit": "%s", "train_tokens_per_s": null, "mfu": null, "peak_bytes": null, "decode_tokens_per_s": null, "stage_seconds": %s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$(cat gpu-bundle/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$stages"
}
# Libraries the GPU machine provides (the driver; cuBLAS and NCCL from pip's nvidia packages).
provided='^(libcuda\.so|libcublas|libcublasLt|libnccl|libnvidia)'

make_bundle() {
  local t0=$SECONDS
  [ -x build/toy ] && [ -x build/tests/toy_gpu_tests ] ||
    { echo "gpu-check: build first (scripts/build.sh, with nvcc present)" >&2; return 1; }
  rm -rf gpu-bundle && mkdir -p gpu-bundle/lib
  cp build/toy build/tests/toy_gpu_tests gpu-bundle/
  git rev-parse --short HEAD >gpu-bundle/COMMIT 2>/dev/null || echo unknown >gpu-bundle/COMMIT
  # Every library outside the base system (libc, libstdc++, libm, ...) travels.
  for bin in gpu-bundle/toy gpu-bundle/toy_gpu_tests; do
    ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) continue ;;
      esac
      [[ "$name" =~ $provided ]] && continue
      cp -L "$path" gpu-bundle/lib/ 2>/dev/null
    done
  done
  tar -czf "$bundle" gpu-bundle
  stage_s[bundle]=$((SECONDS - t0))
}

check_bundle() {
  local size missing
  size=$(stat -c %s "$bundle")
  echo "gpu-check: $bundle is $((size / 1024 / 1024)) MiB (limit 64)"
  [ "$size" -lt $((64 * 1024 * 1024)) ] || { echo "gpu-check: the bundle is over 64 MiB" >&2; return 1; }
  missing=$(for bin in gpu-bundle/toy gpu-bundle/toy_gpu_tests; do
    LD_LIBRARY_PATH=gpu-bundle/lib ldd "$bin" | awk '/not found/ {print $1}'
  done | sort -u | grep -Ev "$provided" || true)
  [ -z "$missing" ] || { echo "gpu-check: the bundle misses $missing" >&2; return 1; }
  echo "gpu-check: ldd closure complete (only the driver, cuBLAS and NCCL come from the machine)"
}

case "$mode" in
  --bundle) make_bundle ;;
  --dry-run)
    make_bundle || exit 1
    check_bundle || exit 1
    json false null null null null null
    ;;
  run)
    t0=$SECONDS
    tar -xzf "$bundle" || { echo "gpu-check: no $bundle (carry it)" >&2; exit 1; }
    libs=$(ls -d /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/site-packages/nvidia/*/lib \
             /usr/local/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':')
    export LD_LIBRARY_PATH="$PWD/gpu-bundle/lib:${libs}${LD_LIBRARY_PATH:-}"
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    stage_s[unpack]=$((SECONDS - t0))
    t0=$SECONDS
    TOY_REQUIRE_GPU=1 timeout 240 gpu-bundle/toy_gpu_tests --gtest_output=json:"$out/gpu_tests.json" \
      >"$out/gpu_tests.log" 2>&1
    stage_s[gpu_tests]=$((SECONDS - t0))
    read -r passed failed skipped < <(python3 - "$out/gpu_tests.json" <<'PY' 2>/dev/null || echo "0 0 0"
import json, sys
j = json.load(open(sys.argv[1]))
tests = [t for s in j["testsuites"] for t in s["testsuite"]]
failed = sum(1 for t in tests if t.get("failures"))
skipped = sum(1 for t in tests if t.get("result") == "SKIPPED")
print(len(tests) - failed - skipped, failed, skipped)
PY
)
    tail -20 "$out/gpu_tests.log"
    json true "$passed" "$failed" "$skipped" "\"${gpu:-unknown}\"" "\"${driver:-unknown}\""
    ;;
  *) echo "usage: scripts/gpu-check.sh [--dry-run|--bundle]" >&2; exit 2 ;;
esac
