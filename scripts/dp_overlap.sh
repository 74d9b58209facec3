#!/usr/bin/env bash
# Benchmark: how much of data-parallel communication the overlap hides. Two "hosts"
# (scripts/netns-hosts.sh, root) on a veth limited to RATE train a ~4.8M-parameter GPT for
# STEPS steps, alternating --dp-overlap on and off for ROUNDS rounds; per run the median over
# steps 3.. of rank 0's exposed communication (seconds spent waiting for the other rank) is
# taken, and the medians of the runs are compared. Last line: one JSON object.
#   scripts/dp_overlap.sh [RATE=1gbit] [ROUNDS=3] [STEPS=12] [extra toy train flags...]
# The toy binary is build/toy (TOY=... to use another).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
rounds=${2:-3}
steps=${3:-12}
shift $(($# < 3 ? $# : 3))
toy=${TOY:-$(pwd)/build/toy}
work=$(mktemp -d /tmp/toy-dp-overlap.XXXXXX)
trap 'scripts/netns-hosts.sh rate off >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
scripts/netns-hosts.sh up >/dev/null
scripts/netns-hosts.sh rate "$rate"

median_exposed() {  # events.jsonl -> "exposed comm tokens_per_s" (medians over steps 3..)
  python3 - "$1" <<'PY'
import json, statistics, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "step"][2:]
m = lambda k: statistics.median(e[k] for e in steps)
print(m("exposed_comm_s"), m("comm_s"), m("tokens_per_s"))
PY
}

declare -A exposed tok
for ((r = 1; r <= rounds; r++)); do
  for mode in on off; do
    out="$work/$mode$r"
    scripts/netns-hosts.sh mpirun "$toy" train --out "$out" --steps "$steps" --layers 6 --dim 256 --heads 4 \
      --ctx 128 --batch 8 --threads 1 --sample-tokens 0 --quiet --eval-every 0 --save-minutes 0 \
      --dp-overlap "$mode" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
    read -r e c t < <(median_exposed "$out/events.jsonl")
    printf 'round %d  overlap %-3s  exposed %.4f s/step  comm %.4f s/step  %.0f tok/s\n' "$r" "$mode" "$e" "$c" "$t"
    exposed[$mode]+="$e "
    tok[$mode]+="$t "
  done
done
python3 - "${exposed[on]}" "${exposed[off]}" "${tok[on]}" "${tok[off]}" "$rate" "$(uname -n)" <<'PY'
import json, statistics, sys
on, off, ton, toff = ([float(x) for x in a.split()] for a in sys.argv[1:5])
r = statistics.median(on) / statistics.median(off)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"exposed with overlap / without: {r:.2f} (target <= 0.50)")
print(json.dumps({"rate": sys.argv[5], "exposed_on_s": statistics.median(on), "exposed_off_s": statistics.median(off),
                  "ratio": r, "tokens_per_s_on": statistics.median(ton), "tokens_per_s_off": statistics.median(toff),
                  "cpu": cpu}))
PY
