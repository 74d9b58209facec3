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
#   scripts/gpu-check.sh --profile   there: where the time goes (bench train with and without
#                                    TF32; ncu's kernel times of a training step and a decode)
# Run mode's stages, each under its own timeout (about 6 minutes at most in all): the GPU tests;
# 50-step tiny training runs in f32 and in bf16 against the CPU's curves (computed here at
# --bundle, carried); the greedy text of the f32 model against the CPU's; `toy bench train
# --preset gpt2-124m` in f32 and in bf16 (the bf16 run reported, its kernel times profiled by
# TOY_CUDA_PROFILE=1); `toy bench run` of GPT-2 124M in BF16 made there with `toy init`; the
# GPU tests again under compute-sanitizer (memcheck, racecheck).
# The last line is one JSON object: tests_passed, tests_failed, tests_skipped, measured, gpu,
# driver, commit, train_tokens_per_s and mfu (bf16; MFU against the H200's 989 TFLOP/s of
# dense BF16), peak_bytes, decode_tokens_per_s, train_curve_max_rel_diff (f32),
# train_curve_bf16_max_rel_diff, generate_equal, stage_seconds (null where a stage failed or
# did not run: its log under $OUT says why).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
bundle=gpu-bundle.tar.gz
out=${OUT:-/tmp/toy-gpu-check}
mkdir -p "$out"
declare -A stage_s
# Measured values (null until a stage sets them).
train_tps=null mfu=null peak_bytes=null decode_tps=null curve_diff=null curve_diff_bf16=null generate_equal=null
json() {  # measured passed failed skipped gpu driver
  local stages="{" k sep=""
  for k in "${!stage_s[@]}"; do stages+="$sep\"$k\": ${stage_s[$k]}"; sep=", "; done
  stages+="}"
  printf '{"measured": %s, "tests_passed": %s, "tests_failed": %s, "tests_skipped": %s, "gpu": %s, "driver": %s, "commit": "%s", "train_tokens_per_s": %s, "mfu": %s, "peak_bytes": %s, "decode_tokens_per_s": %s, "train_curve_max_rel_diff": %s, "train_curve_bf16_max_rel_diff": %s, "generate_equal": %s, "stage_seconds": %s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$(cat gpu-bundle/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$train_tps" "$mfu" "$peak_bytes" "$decode_tps" "$curve_diff" "$curve_diff_bf16" "$generate_equal" "$stages"
}
# The tiny training run both sides make (the CPU's here, carried; the GPU's there).
tiny_train=(--layers 2 --dim 64 --ctx 32 --batch 4 --steps 50 --eval-every 0 --eval-batches 2 --log-every 1
            --seed 1337 --quiet)
# A rehearsal here runs the stages on another device and recipe (TOY_GPU_CHECK_DEVICE=sim,
# TOY_GPU_CHECK_PRESET=cpu-small): everything but the GPU itself.
dev=${TOY_GPU_CHECK_DEVICE:-cuda}
preset=${TOY_GPU_CHECK_PRESET:-gpt2-124m}
# H200's dense BF16 tensor-core rate, the denominator of MFU as the issue states it.
peak_flops=989e12
# Libraries the GPU machine provides (the driver; cuBLAS and NCCL from pip's nvidia packages).
provided='^(libcuda\.so|libcublas|libcublasLt|libnccl|libnvidia)'

make_bundle() {
  local t0=$SECONDS
  [ -x build/toy ] && [ -x build/tests/toy_gpu_tests ] ||
    { echo "gpu-check: build first (scripts/build.sh, with nvcc present)" >&2; return 1; }
  rm -rf gpu-bundle && mkdir -p gpu-bundle/lib
  cp build/toy build/tests/toy_gpu_tests gpu-bundle/
  git rev-parse --short HEAD >gpu-bundle/COMMIT 2>/dev/null || echo unknown >gpu-bundle/COMMIT
  # The CPU's side of the parity stages: a 50-step training curve on a text both sides read,
  # and the greedy continuation of its model.
  cat /usr/share/common-licenses/* 2>/dev/null | head -c 300000 >gpu-bundle/text.txt
  build/toy train --data gpu-bundle/text.txt --out gpu-bundle/cpu-train "${tiny_train[@]}" --device cpu ||
    { echo "gpu-check: the CPU reference run failed" >&2; return 1; }
  rm -f gpu-bundle/cpu-train/checkpoint.gguf gpu-bundle/cpu-train/report.html
  build/toy train --data gpu-bundle/text.txt --out gpu-bundle/cpu-train-bf16 "${tiny_train[@]}" --precision bf16 \
    --device cpu || { echo "gpu-check: the CPU's bf16 reference run failed" >&2; return 1; }
  rm -f gpu-bundle/cpu-train-bf16/*.gguf gpu-bundle/cpu-train-bf16/report.html gpu-bundle/cpu-train-bf16/tokens.bin
  build/toy generate -m gpu-bundle/cpu-train/model.gguf -p "The " --temp 0 -n 40 --device cpu \
    >gpu-bundle/cpu-generate.txt 2>/dev/null || { echo "gpu-check: the CPU reference generation failed" >&2; return 1; }
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

curve_diff() {  # the largest relative difference of two runs' step losses (null when they differ in steps)
  python3 - "$1" "$2" <<'PY' 2>>"${log:-/dev/null}" || echo null
import json, sys
def losses(p):
    return {e["step"]: e["loss"] for e in map(json.loads, open(p)) if e.get("event") == "step"}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and a.keys() == b.keys()
print(max(abs(a[k] - b[k]) / abs(a[k]) for k in a))
PY
}

unpack() {  # there: unpack the bundle and point the loader at the machine's cuBLAS
  tar -xzf "$bundle" || { echo "gpu-check: no $bundle (carry it)" >&2; return 1; }
  # cuBLAS(Lt) from the machine: its PyTorch's pip packages (wherever that python keeps its
  # site-packages), else a CUDA toolkit's lib64.
  local libs d
  libs=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")])
dirs = sorted({os.path.dirname(f) for r in roots
               for f in glob.glob(os.path.join(r, "nvidia", "**", "libcublasLt.so*"), recursive=True)})
print(":".join(dirs))
PY
)
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libs+=":$d"; done
  export LD_LIBRARY_PATH="$PWD/gpu-bundle/lib:${libs#:}:${LD_LIBRARY_PATH:-}"
}

# Kernel time by name from an ncu CSV (gpu__time_duration per launch): the top rows, and the
# total beside the wall time the caller measured.
ncu_table() {
  python3 - "$1" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
t = collections.defaultdict(float); n = collections.Counter()
for r in rows:
    try: v = float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-3)
    except ValueError: continue
    name = r[ki].split("(")[0][:70]; t[name] += v; n[name] += 1
total = sum(t.values())
print(f"{sys.argv[1]}: {sum(n.values())} launches, {total/1e3:.2f} ms of kernel time")
for k, v in sorted(t.items(), key=lambda kv: -kv[1])[:22]:
    print(f"{v/1e3:9.3f} ms {100*v/total:5.1f}% {n[k]:6d}x  {k}")
PY
}

case "$mode" in
  --bundle) make_bundle ;;
  --dry-run)
    make_bundle || exit 1
    check_bundle || exit 1
    json false null null null null null
    ;;
  --profile)
    # There: where the time goes. bench train with and without TF32, then ncu's kernel times of
    # one training step and of a short decode (gpu__time_duration only: one pass, no replay).
    unpack || exit 1
    b=gpu-bundle/toy work=/tmp/toy-gpu-work && rm -rf "$work" && mkdir -p "$work"
    for tf in 0 1; do
      TOY_TF32=$tf timeout 100 $b bench train --preset "$preset" --device "$dev" --json --reps 1 --steps 5 --warmup 2 \
        2>&1 | grep '^{' | sed "s/^/tf32=$tf /" | tee -a "$out/bench.jsonl"
    done
    timeout 40 $b init --arch gpt2 --shape gpt2-124m --type bf16 --out "$work/gpt2.gguf" >/dev/null 2>&1
    TOY_TRACE=$work/decode_trace.json timeout 60 $b bench run -m "$work/gpt2.gguf" --device "$dev" --json --reps 1 -p 128 -n 64 \
      2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
    gzip -c "$work/decode_trace.json" >"$out/decode_trace.json.gz"
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    if [ -n "$ncu" ]; then
      timeout 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu_train.csv" \
        $b bench train --preset "$preset" --device "$dev" --json --reps 1 --steps 1 --warmup 1 >"$work/ncu_train.out" 2>&1
      tail -3 "$work/ncu_train.out"; ncu_table "$out/ncu_train.csv"
      timeout 90 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu_decode.csv" \
        $b bench run -m "$work/gpt2.gguf" --device "$dev" --json --reps 1 -p 16 -n 16 >"$work/ncu_decode.out" 2>&1
      tail -3 "$work/ncu_decode.out"; ncu_table "$out/ncu_decode.csv"
    else
      echo "gpu-check: no ncu on this machine"
    fi
    ;;
  run)
    # $OUT brings back at most 8 files: gpu_tests.json, gpu_tests.log, stages.log (every other
    # stage's log, appended), train_events.jsonl, bench.jsonl, sanitizer.log.
    t0=$SECONDS
    unpack || exit 1
    log=$out/stages.log
    {
      echo "== environment"; nvidia-smi 2>&1 | head -15; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
      ldd gpu-bundle/toy | grep -E 'cuda|cublas|not found'
      nproc; grep -m1 'model name' /proc/cpuinfo
    } >"$log" 2>&1
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    stage_s[unpack]=$((SECONDS - t0))
    t0=$SECONDS
    TOY_REQUIRE_GPU=1 timeout 150 gpu-bundle/toy_gpu_tests --gtest_output=json:"$out/gpu_tests.json" \
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
    grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/gpu_tests.log" | sort -u | tail -25
    b=gpu-bundle/toy
    work=/tmp/toy-gpu-work && rm -rf "$work" && mkdir -p "$work"
    # Parity of a whole run: the tiny training curve (step losses) and the greedy text.
    t0=$SECONDS
    echo "== train ($dev)" >>"$log"
    if timeout 90 $b train --data gpu-bundle/text.txt --out "$work/cuda-train" "${tiny_train[@]}" --device "$dev" \
         >>"$log" 2>&1; then
      cp "$work/cuda-train/events.jsonl" "$out/train_events.jsonl"
      curve_diff=$(curve_diff gpu-bundle/cpu-train/events.jsonl "$work/cuda-train/events.jsonl")
    fi
    echo "== train bf16 ($dev)" >>"$log"
    if timeout 90 $b train --data gpu-bundle/text.txt --out "$work/cuda-train-bf16" "${tiny_train[@]}" --precision bf16 \
         --device "$dev" >>"$log" 2>&1; then
      curve_diff_bf16=$(curve_diff gpu-bundle/cpu-train-bf16/events.jsonl "$work/cuda-train-bf16/events.jsonl")
    fi
    stage_s[train_parity]=$((SECONDS - t0))
    t0=$SECONDS
    echo "== generate ($dev)" >>"$log"
    if timeout 60 $b generate -m gpu-bundle/cpu-train/model.gguf -p "The " --temp 0 -n 40 --device "$dev" \
         >"$work/cuda-generate.txt" 2>>"$log"; then
      if cmp -s "$work/cuda-generate.txt" gpu-bundle/cpu-generate.txt; then generate_equal=true; else
        generate_equal=false; { echo "cpu:"; cat gpu-bundle/cpu-generate.txt; echo "gpu:"; cat "$work/cuda-generate.txt"; } >>"$log"; fi
    fi
    stage_s[generate_parity]=$((SECONDS - t0))
    # Training speed: GPT-2 124M in f32 (logged) and in bf16 (the numbers reported), the bf16
    # run under TOY_CUDA_PROFILE=1 (its table of kernel times goes to the log and the output).
    t0=$SECONDS
    echo "== bench train ($dev, $preset, f32)" >>"$log"
    timeout 120 $b bench train --preset "$preset" --device "$dev" --json --reps 1 --steps 5 --warmup 2 \
      2>>"$log" | grep '^{' >>"$out/bench.jsonl"
    echo "== bench train ($dev, $preset, bf16)" >>"$log"
    if TOY_CUDA_PROFILE=1 timeout 120 $b bench train --preset "$preset" --device "$dev" --precision bf16 --json --reps 1 \
         --steps 5 --warmup 2 >"$work/bench_train.json" 2>"$work/bench_train.log"; then
      grep '^{' "$work/bench_train.json" >>"$out/bench.jsonl"
      read -r train_tps mfu peak_bytes < <(python3 - "$work/bench_train.json" "$peak_flops" <<'PY' 2>>"$log" || echo "null null null"
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print(j["tokens_per_s"], j["tokens_per_s"] * j["flops_per_token"] / float(sys.argv[2]), j["peak_bytes"])
PY
)
    fi
    cat "$work/bench_train.log" >>"$log" 2>/dev/null
    grep -A40 '^toy cuda profile' "$work/bench_train.log" 2>/dev/null
    stage_s[bench_train]=$((SECONDS - t0))
    # Decoding speed: GPT-2 124M in BF16, batch 1.
    t0=$SECONDS
    echo "== bench run ($dev)" >>"$log"
    if timeout 40 $b init --arch gpt2 --shape gpt2-124m --type bf16 --out "$work/gpt2.gguf" >>"$log" 2>&1 &&
       timeout 60 $b bench run -m "$work/gpt2.gguf" --device "$dev" --json --reps 1 -p 128 -n 128 \
         >"$work/bench_run.json" 2>>"$log"; then
      cat "$work/bench_run.json" >>"$out/bench.jsonl"
      decode_tps=$(python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["tg_tokens_per_s"])' \
        "$work/bench_run.json" 2>>"$log" || echo null)
    fi
    # The other shape the issue names: SmolLM2-135M (Llama, GQA, head 64) in BF16 (logged).
    if timeout 40 $b init --arch llama --shape smollm2-135m --type bf16 --out "$work/smollm2.gguf" >>"$log" 2>&1; then
      timeout 60 $b bench run -m "$work/smollm2.gguf" --device "$dev" --json --reps 1 -p 128 -n 128 2>>"$log" |
        grep '^{' >>"$out/bench.jsonl"
    fi
    stage_s[bench_run]=$((SECONDS - t0))
    # Out-of-bounds accesses and shared-memory races the parity tests might not show: the GPU
    # tests under compute-sanitizer (where the machine's runtime allows it), as time permits.
    t0=$SECONDS
    # (TOY_GPU_CHECK_SANITIZER=0 leaves it out: a rerun of unchanged kernels saves ~50 s)
    if [ "$dev" = cuda ] && [ "${TOY_GPU_CHECK_SANITIZER:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
      TOY_REQUIRE_GPU=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 \
        gpu-bundle/toy_gpu_tests --gtest_brief=1 >"$out/sanitizer.log" 2>&1
      echo "memcheck exit $?" >>"$out/sanitizer.log"
      TOY_REQUIRE_GPU=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
        gpu-bundle/toy_gpu_tests --gtest_brief=1 --gtest_filter='CudaAttention.*:CudaUnary.*:CudaScan.*:CudaEdges.*' \
        >>"$out/sanitizer.log" 2>&1
      echo "racecheck exit $?" >>"$out/sanitizer.log"
      tail -4 "$out/sanitizer.log"
    fi
    stage_s[sanitizer]=$((SECONDS - t0))
    json true "$passed" "$failed" "$skipped" "\"${gpu:-unknown}\"" "\"${driver:-unknown}\""
    ;;
  *) echo "usage: scripts/gpu-check.sh [--dry-run|--bundle|--profile]" >&2; exit 2 ;;
esac
