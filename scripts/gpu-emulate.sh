#!/usr/bin/env bash
# Checks the CUDA kernels without a GPU: builds the tests/gpu tests against an emulator of the
# CUDA launch model (tools/cuda-emu: each thread of a block a fiber, barriers and warp shuffles
# as CUDA defines them) from the current tree, and runs them on the sim device, where they
# compare the CPU's kernels with the emulated CUDA ones. New kernel (*.cu, *.cuh), glue
# (glue_*.cpp) and test (tests/gpu/test_cuda*.cpp) files are picked up by glob.
#
#   scripts/gpu-emulate.sh [GTEST_FILTER]      e.g. 'CudaRows.*' or 'CudaScan.*-*ModelsSize*'
#
# Needs the main build (scripts/build.sh: build/libtoy.a and its flags), ninja, python3 and
# the CUDA toolkit's headers (no GPU, no nvcc). Builds into build-emu/ (incremental; the
# build's log is build-emu/build.log, the tests' build-emu/test.log) and ends with
#   emulated GPU tests: N passed, M failed, K not emulated
# Exit status: 0 all passed; 1 a test failed or a file did not build in the emulator; 2 no build.
# Not emulated: the cuBLAS matmuls (CudaMatmul.*), the GPU-count test, and what
# tools/cuda-emu/emu_cuda.h lists (the device math library's bits, real concurrency, ...):
# passing here does not replace a run on a GPU.
#
# Environment:
#   TOY_BUILD_LOCK=/tmp/toy-build.lock  run every compile and test run under `flock` on it
#   CUDA_EMU_ORDER=reverse|shuffle[:SEED]  the order blocks, warps and lanes run in (default forward)
#   CUDA_EMU_GUARD_PAGES=1   each sim allocation between inaccessible pages (overruns fault)
#   CUDA_EMU_CONTRACT=off    compile the kernels without FMA contraction (nvcc contracts)
#   CUDA_EMU_SKIP=k1,k2      leave those kernels (registry names) to the CPU on sim
#   CUDA_EMU_JOBS=N          parallel compiles (default: the number of cores)
#   CUDA_EMU_TEST_TIMEOUT=S  a test silent for S seconds is killed and failed (default 900)
#   CUDA_EMU_BUILD_DIR=DIR   instead of build-emu/
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;; esac
if [ ! -f build/libtoy.a ] || [ ! -f build/build.ninja ]; then
  echo "gpu-emulate: no main build (build/libtoy.a): run scripts/build.sh first" >&2
  exit 2
fi
for tool in ninja python3 nm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "gpu-emulate: needs $tool" >&2; exit 2; }
done
exec python3 tools/cuda-emu/emulate.py "$@"
