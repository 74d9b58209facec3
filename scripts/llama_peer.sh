#!/usr/bin/env bash
# llama.cpp as a benchmark peer: builds llama-bench (and, with --server, llama-server) from
# the llama.cpp source snapshot that node-llama-cpp ships (tools/llamacpp/node_modules/
# node-llama-cpp/llama/gitRelease.bundle), outside toy's build, with native CPU flags; then,
# given a model, runs llama-bench and `toy bench run` on the same file, same threads, in
# alternating rounds ($TOY_PEER_ROUNDS, default 5), and prints the medians and their ratios.
#
#   scripts/llama_peer.sh [--server] [MODEL.gguf [THREADS]]
#
# Build folder: $TOY_PEER_DIR (default ~/.cache/toy/llama.cpp); built once, reused.
# Needs `npm ci` in tools/llamacpp (scripts/test.sh does it) and cmake + a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
server=0
if [[ "${1:-}" == "--server" ]]; then server=1; shift; fi
model="${1:-}"
threads="${2:-$(nproc)}"
peer="${TOY_PEER_DIR:-$HOME/.cache/toy/llama.cpp}"
bundle=tools/llamacpp/node_modules/node-llama-cpp/llama/gitRelease.bundle
[[ -f "$bundle" ]] || { echo "llama_peer.sh: $bundle missing: run npm ci in tools/llamacpp" >&2; exit 1; }

if [[ ! -d "$peer/src" ]]; then
  mkdir -p "$peer"
  git clone -q "$bundle" "$peer/src"
fi
commit=$(git -C "$peer/src" rev-parse --short HEAD)
tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' tools/llamacpp/node_modules/node-llama-cpp/llama/llama.cpp.info.json)
targets=(llama-bench)
[[ $server == 1 ]] && targets+=(llama-server)
if ! [[ -x "$peer/build/bin/llama-bench" ]] || { [[ $server == 1 ]] && ! [[ -x "$peer/build/bin/llama-server" ]]; }; then
  echo "llama_peer.sh: building ${targets[*]} (llama.cpp $tag, snapshot $commit) in $peer/build" >&2
  # AMX off: a VM can report AMX in CPUID without enabling its tile state, and ggml's AMX
  # kernels (compiled in by -march=native) then die on their first tile instruction (seen on
  # a Sapphire Rapids guest).
  noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$peer/src" -B "$peer/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_SERVER=$([[ $server == 1 ]] && echo ON || echo OFF) \
    >/dev/null
  cmake --build "$peer/build" --target "${targets[@]}"
fi
echo "llama.cpp $tag (node-llama-cpp 3.21.1 snapshot $commit): $peer/build/bin"
[[ -z "$model" ]] && exit 0

# Rounds alternate llama.cpp and toy (one pp512 + tg128 each), so the machine's drift (these
# shared machines swing by 1.5x over minutes) hits both alike; medians are compared.
rounds="${TOY_PEER_ROUNDS:-5}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 0; i < rounds; i++)); do
  "$peer/build/bin/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o json >"$tmp/llama.$i.json" 2>/dev/null
  build/toy bench run -m "$model" --threads "$threads" --reps 1 --json >"$tmp/toy.$i.json"
done
python3 - "$tmp" "$rounds" "$model" "$threads" "$tag" "$commit" <<'PY'
import json, statistics, sys
tmp, rounds, model, threads, tag, commit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
lpp, ltg, tpp, ttg, frac = [], [], [], [], []
for i in range(rounds):
    for r in json.load(open("%s/llama.%d.json" % (tmp, i))):
        (lpp if r["n_prompt"] > 0 else ltg).append(r["avg_ts"])
    t = json.load(open("%s/toy.%d.json" % (tmp, i)))
    tpp.append(t["pp_tokens_per_s"]); ttg.append(t["tg_tokens_per_s"]); frac.append(t["tg_bandwidth_fraction"])
    cpu = t.get("cpu", "?")
m = statistics.median
print("%s, %s threads, %s, llama.cpp %s (snapshot %s), medians of %d alternating rounds" % (model, threads, cpu, tag, commit, rounds))
print("  pp512  llama.cpp %7.1f tok/s   toy %7.1f tok/s   toy/llama.cpp %.2f" % (m(lpp), m(tpp), m(tpp) / m(lpp)))
print("  tg128  llama.cpp %7.1f tok/s   toy %7.1f tok/s   toy/llama.cpp %.2f   (toy reads weights at %.2f of measured bandwidth)"
      % (m(ltg), m(ttg), m(ttg) / m(ltg), m(frac)))
PY
