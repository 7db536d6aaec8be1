#!/usr/bin/env bash
# Specula vs llama.cpp on the same GGUF, the same machine and the same thread count, in one run: rounds of
# `specula bench` and llama.cpp alternating, then a table of pp, tg, verify(V) in decode steps, peak RSS
# and the decode roofline fraction (bytes read per token from the file's tensors; the memory bandwidth is
# measured here, in the same run, by build/bin/bench_bandwidth).
#
# usage: bench/compare_llama.sh [MODEL.gguf | --real-e2b] [--prompt-tokens N] [--gen-tokens N]
#                               [--repetitions N] [--threads N] [--rounds N] [--verify V] [--backend vulkan]
#                               [--mtp DRAFTER.gguf [--acceptance-profile a1,a2,...]]
#   --real-e2b  writes (once) and uses a real-shape Gemma 4 E2B Q8_0 file with random weights
#               (tools/gemma4_fixture.py --variant e2b-real; about 5 GB under build/fixtures).
#   --verify V  also times one forward of V tokens (a speculative verification of V - 1 drafts); 0: skip
#   --backend vulkan  Specula on its Vulkan backend against llama.cpp's Vulkan build (node-llama-cpp with
#               @node-llama-cpp/linux-x64-vulkan, every layer offloaded); bench/gpu_check.sh uses it
#   --mtp D     also the MTP speed-up each engine gets at an acceptance profile (default vLLM's on 26B-A4B,
#               0.844,0.599,0.385,0.271: entry i is the fraction of rounds whose first i drafts are all
#               accepted), with the drafter D (llama.cpp's upstream gemma4-assistant layout, which both read),
#               on a 64-token prompt, from each engine's measured round costs, for K = 1..8 drafts:
#                 E(K) = 1 + a_1 + ... + a_K   tokens per round (a_i = 0 past the profile)
#                 round(K) = D(K) + verify(K + 1),  D(K) = the time of drafting K tokens (about K x a draft step)
#                 speed-up(K) = E(K) / (round(K) / decode step)
#               Specula: verify(K + 1), D(K) and the step from `specula bench --drafter D` (verify_costs and tg);
#               then the replay measured end to end (`specula bench --acceptance-profile`) at its best K
#               and with --draft-max auto. llama.cpp: tools/llama-mtp-trace --time, its own draft-mtp loop
#               (common_speculative_draft + _process per round = D(K); the decode of [last, drafts] with all
#               logits = verify(K + 1); 16 single-token decodes on the same context = the step), one run per K.
#               Random weights accept nothing by themselves: this is a replay of the profile, not a
#               measurement of acceptance (docs/performance.md, "Acceptance replay").
# The llama.cpp side: $LLAMA_BENCH, a llama-bench-lite binary (`../shared/tools/llama-bench-lite/build.sh`
# prints one; llama.cpp's C API driven as llama-bench measures: the figures in docs/performance.md), else
# bench/llama_peer.mjs through node-llama-cpp (its JavaScript loop adds a little per-token time).
# Environment: BUILD (default build), SPECULA (default $BUILD/bin/specula), LLAMA_BENCH, LLAMA_MTP_TRACE
# (default: built by tools/llama-mtp-trace/build.sh into $BUILD/llama-mtp-trace on first use).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
specula="${SPECULA:-$build/bin/specula}"
bandwidth="$build/bin/bench_bandwidth"
model="" pp=512 tg=128 reps=3 threads=0 rounds=2 verify=4 backend=cpu mtp="" profile=0.844,0.599,0.385,0.271
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
    --mtp) mtp="$2"; shift ;;
    --acceptance-profile) profile="$2"; shift ;;
    -*) echo "compare_llama.sh: unknown option $1" >&2; exit 2 ;;
    *) model="$1" ;;
  esac
  shift
done
[ -n "$model" ] || { sed -n 2,37p "$0" >&2; exit 2; }
for tool in "$specula" "$bandwidth"; do
  [ -x "$tool" ] || { echo "compare_llama.sh: $tool not found; run 'make build' first" >&2; exit 1; }
done
if [ "$model" = "--real-e2b" ]; then
  out="$build/fixtures/gemma4-e2b-real"
  /usr/bin/python3 "$root/tools/gemma4_fixture.py" --variant e2b-real --out "$out" --formats q8_0
  model="$out/model-q8_0.gguf"
fi
[ -f "$model" ] || { echo "compare_llama.sh: no such model file: $model" >&2; exit 1; }
mtp_trace=""
if [ -n "$mtp" ]; then
  [ -f "$mtp" ] || { echo "compare_llama.sh: no such drafter file: $mtp" >&2; exit 1; }
  [ "$backend" = cpu ] || [ "$backend" = onednn ] || { echo "compare_llama.sh: --mtp measures llama.cpp's CPU build only (tools/llama-mtp-trace); drop --backend $backend" >&2; exit 2; }
  mtp_trace="${LLAMA_MTP_TRACE:-$build/llama-mtp-trace}"
  if [ ! -x "$mtp_trace" ]; then  # llama.cpp's libraries and headers come with llama-bench-lite
    [ -d "$HOME/.cache/llama-bench-lite/llama.cpp/include" ] || "$root/../shared/tools/llama-bench-lite/build.sh" >&2
    "$root/tools/llama-mtp-trace/build.sh" "$build" >&2
  fi
fi
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
# MTP: Specula's replay of the profile (its verify costs come with it) on a 64-token prompt, and the same
# prompt's ids for llama.cpp's draft-mtp loop.
mtp_ours() {  # extra bench flags
  "$specula" bench --model "$model" --drafter "$mtp" --acceptance-profile "$profile" --prompt-tokens 64 \
    --gen-tokens "$tg" --repetitions "$reps" --threads "$threads" --context-length "$ctx" --json -q "$@"
}
mtp_ids=$(/usr/bin/python3 -c 'import json, sys
vocab = next(t["shape"][0] for t in json.load(open(sys.argv[1]))["tensors"] if t["name"] == "token_embd.weight")
x, out = 12345, [2]
while len(out) < 64:
    x = (x * 1103515245 + 12345) % 2147483648
    out.append(300 + x % min(30000, vocab - 300))
print(",".join(map(str, out)))' "$work/inspect.json")
for r in $(seq "$rounds"); do
  echo "round $r/$rounds: bandwidth, specula, llama.cpp ..." >&2
  "$bandwidth" --threads "$threads" > "$work/bw.$r"
  ours "$pp" "$tg" "$reps" > "$work/ours.$r"
  peer "$pp" "$tg" "$reps" > "$work/peer.$r"
  if [ "$verify" -gt 0 ]; then
    ours "$verify" 16 "$reps" > "$work/ours_v.$r"
    peer "$verify" 16 "$reps" > "$work/peer_v.$r"
  fi
  if [ -n "$mtp" ]; then
    echo "round $r/$rounds: MTP, specula (auto, then its best K), llama.cpp (K = 1..8) ..." >&2
    mtp_ours --draft-max auto > "$work/mtp_ours.$r"
    best=$(/usr/bin/python3 -c 'import json, sys
j = json.loads(open(sys.argv[1]).read()); a = [float(x) for x in sys.argv[2].split(",")]
E = lambda k: 1 + sum(a[:k])
print(max(j["verify_costs"], key=lambda c: E(c["draft_tokens"]) / c["round_steps"])["draft_tokens"])' "$work/mtp_ours.$r" "$profile")
    mtp_ours --draft-max "$best" > "$work/mtp_ours_best.$r"
    for k in 1 2 3 4 5 6 7 8; do
      "$mtp_trace" --time --ids "$mtp_ids" --trace "$work/mtp_peer.$r.$k" -m "$model" -md "$mtp" --spec-type draft-mtp \
        --spec-draft-n-max "$k" -n 32 --temp 0 -c "$ctx" -t "$threads" > "$work/mtp_peer.$r.$k.log" 2>&1 || {
        tail -n 20 "$work/mtp_peer.$r.$k.log" >&2
        echo "compare_llama.sh: llama.cpp's draft-mtp failed with $mtp (K = $k; its log above). llama.cpp reads" \
             "the upstream gemma4-assistant layout only: tools/llama-mtp-trace/seed_to_upstream.py converts the seed's" >&2
        exit 1
      }
    done
  fi
done

/usr/bin/python3 - "$work" "$rounds" "$verify" "$threads" "$mtp" "$profile" <<'PY'
import json, re, statistics, sys
work, rounds, verify, threads, mtp, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
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
experts, used = meta_int(".expert_count"), meta_int(".expert_used_count")
# Bytes a decode step reads: every weight once, the tied head in full, one row of the per-layer
# embedding table, top-k of each layer's experts (a mixture of experts: `*_exps` tensors hold all E);
# KV-shared layers' own K/V weights are never read.
per_token = 0
for t in info["tensors"]:
    name, size = t["name"], t["bytes"]
    m = re.match(r"blk\.(\d+)\.attn_[kv]\.weight$", name)
    if m and shared and int(m.group(1)) >= layers - shared: continue
    if name == "per_layer_token_embd.weight": size //= t["shape"][0]
    if "_exps." in name and experts and used: size = size * used // experts
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
if mtp:
    # E(K) tokens per round in D(K) + verify(K + 1): the speed-up over decode steps, per engine, from the
    # medians over rounds of each cost.
    a = [float(x) for x in profile.split(",")]
    E = lambda k: 1 + sum(a[:k])
    mo, mb = load("mtp_ours"), load("mtp_ours_best")
    def peer_trace(r, k):
        lines = open(f"{work}/mtp_peer.{r}.{k}").read().splitlines()
        return json.loads(lines[-1])["summary"]
    ks = range(1, 9)
    ours_cost = {k: [next(c for c in j["verify_costs"] if c["draft_tokens"] == k) for j in mo] for k in ks}
    o_step = med([1e3 / j["tg_tokens_per_second"] for j in mo])
    o_v = {k: med([c["verify_ms"] for c in ours_cost[k]]) for k in ks}
    o_d = {k: med([c["draft_ms"] for c in ours_cost[k]]) for k in ks}
    pt = {k: [peer_trace(r, k) for r in range(1, rounds + 1)] for k in ks}
    p_step = med([t["decode_ms"] for k in ks for t in pt[k]])
    p_v = {k: med([t["verify_ms"] for t in pt[k]]) for k in ks}
    p_d = {k: med([t["draft_ms"] + t["process_ms"] for t in pt[k]]) for k in ks}
    o_x = {k: E(k) / ((o_d[k] + o_v[k]) / o_step) for k in ks}
    p_x = {k: E(k) / ((p_d[k] + p_v[k]) / p_step) for k in ks}
    print(f"\nMTP at acceptance profile {profile} (drafter {mtp}); E(K) = 1 + a_1 + ... + a_K tokens per round,")
    print(f"round(K) = D(K) + verify(K+1), speed-up = E(K) / (round / decode step); decode step {o_step:.1f} ms (specula), "
          f"{p_step:.1f} ms (llama.cpp)")
    print(f"{'':4}{'':>6} | {'specula: verify':>15}{'D(K)':>8}{'round':>8}{'speed-up':>9} | {'llama.cpp: verify':>17}{'D(K)':>8}{'round':>8}{'speed-up':>9}")
    print(f"{'K':4}{'E(K)':>6} | {'ms':>15}{'ms':>8}{'steps':>8}{'':>9} | {'ms':>17}{'ms':>8}{'steps':>8}{'':>9}")
    for k in ks:
        print(f"{k:<4}{E(k):6.2f} | {o_v[k]:15.1f}{o_d[k]:8.1f}{(o_v[k] + o_d[k]) / o_step:8.2f}{o_x[k]:8.2f}x | "
              f"{p_v[k]:17.1f}{p_d[k]:8.1f}{(p_v[k] + p_d[k]) / p_step:8.2f}{p_x[k]:8.2f}x")
    ob, pb = max(ks, key=lambda k: o_x[k]), max(ks, key=lambda k: p_x[k])
    best_k = mb[0]["speculative"]["draft_tokens"]
    rep = lambda js: med([j["replay_speedup"] for j in js])
    tpr = lambda js: med([j["replay_tokens_per_round"] for j in js])
    print(f"best K   specula K = {ob}: projected {o_x[ob]:.2f}x; replay measured end to end at K = {best_k}: "
          f"{rep(mb):.2f}x ({tpr(mb):.2f} tokens/round), with --draft-max auto: {rep(mo):.2f}x "
          f"(mean K {med([j['replay_mean_draft_tokens'] for j in mo]):.2f})")
    print(f"         llama.cpp K = {pb}: projected {p_x[pb]:.2f}x;   specula / llama.cpp at the best K of each: "
          f"{o_x[ob] / p_x[pb]:.2f} (projected), {rep(mb) / p_x[pb]:.2f} (specula's replay)")
PY
