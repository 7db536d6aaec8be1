#!/usr/bin/env bash
# Specula vs llama.cpp on the same GGUF, the same machine and the same thread count, in one run: rounds of
# `specula bench` and llama.cpp alternating, then a table of pp, tg, verify(V) in decode steps, peak RSS
# and the decode roofline fraction (bytes read per token from the file's tensors; the memory bandwidth is
# measured here, in the same run, by build/bin/bench_bandwidth).
#
# usage: bench/compare_llama.sh [MODEL.gguf | --real-e2b] [--prompt-tokens N] [--gen-tokens N]
#                               [--repetitions N] [--threads N] [--rounds N] [--verify V] [--backend vulkan]
#   --real-e2b  writes (once) and uses a real-shape Gemma 4 E2B Q8_0 file with random weights
#               (tools/gemma4_fixture.py --variant e2b-real; about 5 GB under build/fixtures).
#   --verify V  also times one forward of V tokens (a speculative verification of V - 1 drafts); 0: skip
#   --backend vulkan  Specula on its Vulkan backend against llama.cpp's Vulkan build (node-llama-cpp with
#               @node-llama-cpp/linux-x64-vulkan, every layer offloaded); bench/gpu_check.sh uses it
# The llama.cpp side: $LLAMA_BENCH, a llama-bench-lite binary (`../shared/tools/llama-bench-lite/build.sh`
# prints one; llama.cpp's C API driven as llama-bench measures: the figures in docs/performance.md), else
# bench/llama_peer.mjs through node-llama-cpp (its JavaScript loop adds a little per-token time).
# Environment: BUILD (default build), SPECULA (default $BUILD/bin/specula), LLAMA_BENCH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
specula="${SPECULA:-$build/bin/specula}"
bandwidth="$build/bin/bench_bandwidth"
model="" pp=512 tg=128 reps=3 threads=0 rounds=2 verify=4 backend=onednn
while [ $# -gt 0 ]; do
  case "$1" in
    --real-e2b) model="--real-e2b" ;;
    --prompt-tokens) pp="$2"; shift ;;
    --gen-tokens) tg="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --verify) verify="$2"; shift ;;
    --backend) backend="$2"; shift ;;
    -*) echo "compare_llama.sh: unknown option $1" >&2; exit 2 ;;
    *) model="$1" ;;
  esac
  shift
done
[ -n "$model" ] || { sed -n 2,18p "$0" >&2; exit 2; }
for tool in "$specula" "$bandwidth"; do
  [ -x "$tool" ] || { echo "compare_llama.sh: $tool not found; run 'make build' first" >&2; exit 1; }
done
if [ "$model" = "--real-e2b" ]; then
  out="$build/fixtures/gemma4-e2b-real"
  /usr/bin/python3 "$root/tools/gemma4_fixture.py" --variant e2b-real --out "$out" --formats q8_0
  model="$out/model-q8_0.gguf"
fi
[ -f "$model" ] || { echo "compare_llama.sh: no such model file: $model" >&2; exit 1; }
[ "$threads" -gt 0 ] || threads=$(nproc)
if [ -z "${LLAMA_BENCH:-}" ] && [ ! -d "$root/tools/llama-ref/node_modules/node-llama-cpp" ]; then
  (cd "$root/tools/llama-ref" && npm install --ignore-scripts --omit=optional --no-audit --no-fund >&2)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$specula" inspect --json "$model" > "$work/inspect.json"
# llama.cpp runs with n_ctx 4096; so does Specula here, unless the model's own context is smaller.
ctx=$(/usr/bin/python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))["metadata"]
n = [v for k, v in m.items() if k.endswith(".context_length") and isinstance(v, int)]
print(min([4096] + n))' "$work/inspect.json")
# One measurement of each engine: pp over N tokens and tg over G, R repetitions, as one JSON line.
ours() {  # N G R
  "$specula" bench --model "$model" --backend "$backend" --prompt-tokens "$1" --gen-tokens "$2" --repetitions "$3" \
    --threads "$threads" --context-length "$ctx" --no-drafter --json -q
}
peer() {  # N G R
  if [ "$backend" = vulkan ]; then
    node "$root/bench/llama_peer.mjs" "$model" --prompt-tokens "$1" --gen-tokens "$2" --repetitions "$3" --threads "$threads" --gpu vulkan
  elif [ -n "${LLAMA_BENCH:-}" ]; then
    "$LLAMA_BENCH" bench "$model" "$threads" "$1" "$2" "$3" | tail -n1
  else
    node "$root/bench/llama_peer.mjs" "$model" --prompt-tokens "$1" --gen-tokens "$2" --repetitions "$3" --threads "$threads"
  fi
}
for r in $(seq "$rounds"); do
  echo "round $r/$rounds: bandwidth, specula, llama.cpp ..." >&2
  "$bandwidth" --threads "$threads" > "$work/bw.$r"
  ours "$pp" "$tg" "$reps" > "$work/ours.$r"
  peer "$pp" "$tg" "$reps" > "$work/peer.$r"
  if [ "$verify" -gt 0 ]; then
    ours "$verify" 16 "$reps" > "$work/ours_v.$r"
    peer "$verify" 16 "$reps" > "$work/peer_v.$r"
  fi
done

/usr/bin/python3 - "$work" "$rounds" "$verify" "$threads" <<'PY'
import json, re, statistics, sys
work, rounds, verify, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def load(name):
    out = []
    for r in range(1, rounds + 1):
        text = open(f"{work}/{name}.{r}").read()
        out.append(json.loads(text[text.index("{"):]))
    return out
def num(j, *keys):  # specula bench --json, llama-bench-lite and llama_peer.mjs name their figures differently
    for k in keys:
        if k in j: return float(j[k])
    raise KeyError(keys)
ours, peer = load("ours"), load("peer")
bw = [float(open(f"{work}/bw.{r}").read()) for r in range(1, rounds + 1)]
info = json.load(open(f"{work}/inspect.json"))
meta = info["metadata"]
def meta_int(suffix):
    for k, v in meta.items():
        if k.endswith(suffix) and isinstance(v, int): return v
    return 0
layers, shared = meta_int(".block_count"), meta_int(".attention.shared_kv_layers")
# Bytes a decode step reads: every weight once, the tied head in full, one row of the per-layer
# embedding table; KV-shared layers' own K/V weights are never read.
per_token = 0
for t in info["tensors"]:
    name, size = t["name"], t["bytes"]
    m = re.match(r"blk\.(\d+)\.attn_[kv]\.weight$", name)
    if m and shared and int(m.group(1)) >= layers - shared: continue
    if name == "per_layer_token_embd.weight": size //= t["shape"][0]
    per_token += size
med = statistics.median
a_pp, b_pp = [num(j, "pp_tokens_per_second", "pp_tok_s") for j in ours], [num(j, "pp_tokens_per_second", "pp_tok_s") for j in peer]
a_tg, b_tg = [num(j, "tg_tokens_per_second", "tg_tok_s") for j in ours], [num(j, "tg_tokens_per_second", "tg_tok_s") for j in peer]
a = ours[0]
print(f"model    {a['model']}\ndevice   {a['device']}\nthreads  {threads}, prompt {a['prompt_tokens']} tokens, generate "
      f"{a['gen_tokens']}, {rounds} alternating round(s), medians\nbandwidth {', '.join(f'{x:.1f}' for x in bw)} GB/s; "
      f"{per_token / 1e6:.0f} MB read per decode token")
print(f"{'':22}{'specula':>12}{'llama.cpp':>12}{'ratio':>8}   (specula / llama.cpp: higher is better for tok/s, lower for the rest)")
def row(label, x, y, fmt="{:12.2f}"):
    print(f"{label:22}" + fmt.format(x) + fmt.format(y) + f"{x / y:8.2f}")
row(f"pp{a['prompt_tokens']} tok/s", med(a_pp), med(b_pp))
row(f"tg{a['gen_tokens']} tok/s", med(a_tg), med(b_tg))
roof = med(bw) * 1e9 / per_token
print(f"{'tg roofline fraction':22}{med(a_tg) / roof:12.0%}{med(b_tg) / roof:12.0%}   (roofline {roof:.2f} tok/s)")
if verify > 0:
    ov, pv = load("ours_v"), load("peer_v")
    steps = lambda js: med([(verify / num(j, "pp_tokens_per_second", "pp_tok_s")) * num(j, "tg_tokens_per_second", "tg_tok_s") for j in js])
    ms = lambda js: med([1e3 * verify / num(j, "pp_tokens_per_second", "pp_tok_s") for j in js])
    row(f"verify({verify}) ms", ms(ov), ms(pv), "{:12.1f}")
    row(f"verify({verify}) steps", steps(ov), steps(pv))
rss = [j.get("peak_rss_mib") for j in peer]
if all(isinstance(x, (int, float)) for x in rss):
    row("peak RSS MiB", med([j["peak_rss_mib"] for j in ours]), med(rss), "{:12.0f}")
else:
    print(f"{'peak RSS MiB':22}{med([j['peak_rss_mib'] for j in ours]):12.0f}{'n/a':>12}")
PY
