#!/usr/bin/env bash
# Specula vs llama.cpp on the same GGUF, the same machine and the same thread count, in one run:
# `specula bench` and bench/llama_peer.mjs measure prompt processing (pp) and greedy token generation
# (tg) the same way; the table gives specula / llama.cpp for each.
#
# usage: bench/compare_llama.sh [MODEL.gguf | --real-e2b] [--prompt-tokens N] [--gen-tokens N]
#                               [--repetitions N] [--threads N]
#   --real-e2b  writes (once) and uses a real-shape Gemma 4 E2B Q8_0 file with random weights
#               (tools/gemma4_fixture.py --variant e2b-real; about 5 GB under build/fixtures).
# Environment: BUILD (default build), SPECULA (default $BUILD/bin/specula).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
specula="${SPECULA:-$build/bin/specula}"
model="" pp=512 tg=128 reps=3 threads=0
while [ $# -gt 0 ]; do
  case "$1" in
    --real-e2b) model="--real-e2b" ;;
    --prompt-tokens) pp="$2"; shift ;;
    --gen-tokens) tg="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    -*) echo "compare_llama.sh: unknown option $1" >&2; exit 2 ;;
    *) model="$1" ;;
  esac
  shift
done
[ -n "$model" ] || { sed -n 2,10p "$0" >&2; exit 2; }
[ -x "$specula" ] || { echo "compare_llama.sh: $specula not found; run 'make build' first" >&2; exit 1; }
if [ "$model" = "--real-e2b" ]; then
  out="$build/fixtures/gemma4-e2b-real"
  /usr/bin/python3 "$root/tools/gemma4_fixture.py" --variant e2b-real --out "$out" --formats q8_0
  model="$out/model-q8_0.gguf"
fi
[ -f "$model" ] || { echo "compare_llama.sh: no such model file: $model" >&2; exit 1; }
[ "$threads" -gt 0 ] || threads=$(nproc)
if [ ! -d "$root/tools/llama-ref/node_modules/node-llama-cpp" ]; then
  (cd "$root/tools/llama-ref" && npm install --ignore-scripts --omit=optional --no-audit --no-fund >&2)
fi

common=(--prompt-tokens "$pp" --gen-tokens "$tg" --repetitions "$reps" --threads "$threads")
ours=$(mktemp) peer=$(mktemp)
trap 'rm -f "$ours" "$peer"' EXIT
echo "specula bench ..." >&2
# llama.cpp runs with a 4096-token context whatever the file says; so does Specula here.
"$specula" bench --model "$model" "${common[@]}" --context-length 4096 --json -q > "$ours"
echo "llama.cpp ..." >&2
node "$root/bench/llama_peer.mjs" "$model" "${common[@]}" > "$peer"

/usr/bin/python3 - "$ours" "$peer" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"model   {a['model']}\nthreads {a['threads'] or 'all'}, prompt {a['prompt_tokens']} tokens, "
      f"generate {a['gen_tokens']}, median of {a['repetitions']}")
print(f"{'':14}{'specula':>12}{'llama.cpp':>12}{'ratio':>8}")
for key, label in (("pp", f"pp{a['prompt_tokens']} tok/s"), ("tg", f"tg{a['gen_tokens']} tok/s")):
    x, y = a[f"{key}_tokens_per_second"], b[f"{key}_tokens_per_second"]
    print(f"{label:14}{x:12.2f}{y:12.2f}{x / y:8.2f}")
print(f"{'peak RSS MiB':14}{a['peak_rss_mib']:12.0f}{b['peak_rss_mib']:12.0f}{a['peak_rss_mib'] / b['peak_rss_mib']:8.2f}")
print(f"{'load s':14}{a['load_seconds']:12.2f}{b['load_seconds']:12.2f}")
EOF
