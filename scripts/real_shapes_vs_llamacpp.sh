#!/usr/bin/env bash
# Developer check (not CI: the files are hundreds of MB to gigabytes): `toy init` files of the
# published models' real shapes, in the given types, run in llama.cpp (node-llama-cpp, the
# oracle CI uses on the tiny shapes) as in toy — the next-token log-probabilities over a
# 24-token sequence and the most likely token at each position.
#
#   scripts/real_shapes_vs_llamacpp.sh [ARCH:SHAPE ...]     (default: the small real shapes)
#   scripts/real_shapes_vs_llamacpp.sh FILE.gguf ...        (files made already, e.g. a 17 GB one)
#
# TYPES (default "f32 f16 q8_0 q4_k_m") picks the weight types; DIR (default /tmp/toy-real-shapes)
# holds the files (each removed after its check). Prints one line per file:
#   ARCH SHAPE TYPE max|dlogp|=X argmax=N/24
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
toy=${TOY:-$root/build/toy}
dir=${DIR:-/tmp/toy-real-shapes}
types=${TYPES:-f32 f16 q8_0 q4_k_m}
pairs=("$@")
((${#pairs[@]})) || pairs=(gemma3:gemma3-270m lfm2:lfm2-350m granitemoe:granite-3.1-1b-a400m llama:smollm2-135m)
mkdir -p "$dir"
ids=${IDS:-"[1,17,300,4096,12,99,2048,7,511,1000,3,64,129,2,8191,45,600,23,1500,88,5,777,31,256]"}
for pair in "${pairs[@]}"; do
  arch=${pair%%:*} shape=${pair#*:}
  for type in $( [[ $pair == *.gguf ]] && echo file || echo $types ); do
    if [[ $type == file ]]; then
      model=$pair arch=$(basename "$pair") shape="" type=""
    else
      model="$dir/$arch-$shape-$type.gguf"
      "$toy" init --arch "$arch" --shape "$shape" --type "$type" --seed 3 --out "$model" 2>/dev/null
    fi
    "$toy" eval -m "$model" --tokens "${ids:1:-1}" --dump-logits "$dir/toy.bin" >/dev/null
    TOY_LLAMACPP_THREADS=2 node "$root/tools/llamacpp/logprobs.mjs" "$model" "$ids" >"$dir/llama.json"
    python3 - "$dir/toy.bin" "$dir/llama.json" "$arch $shape $type" <<'PY'
import json, math, struct, sys
ref = json.load(open(sys.argv[2]))
V, T = ref["n_vocab"], ref["n_tokens"]
raw = open(sys.argv[1], "rb").read()
logits = struct.unpack(f"<{T * V}f", raw)
worst, agree = 0.0, 0
for t in range(T):
    row = logits[t * V:(t + 1) * V]
    m = max(row)
    lse = m + math.log(sum(math.exp(z - m) for z in row))
    theirs = ref["logprobs"][t]
    for v in range(V):
        if theirs[v] is not None and theirs[v] > -30:
            worst = max(worst, abs((row[v] - lse) - theirs[v]))
    mine = max(range(V), key=lambda v: row[v])
    best = max(range(V), key=lambda v: -1e30 if theirs[v] is None else theirs[v])
    agree += mine == best
print(f"{sys.argv[3]} max|dlogp|={worst:.2e} argmax={agree}/{T}", flush=True)
PY
    [[ -z $type ]] || rm -f "$model"
  done
done
