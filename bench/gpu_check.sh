#!/usr/bin/env bash
# The Vulkan backend on a real GPU, in one run: which device the backend picks, the Vulkan parity suites
# on it, then `specula bench` on real-shape Gemma 4 E2B files (random weights; Q8_0, and Q4_K_M from
# Specula's quantizer: Q4_K with Q5_K/Q6_K/Q5_0 rows, the mix a download has) next to llama.cpp's Vulkan
# build (node-llama-cpp 3.22.1 with @node-llama-cpp/linux-x64-vulkan, every layer on the GPU), rounds
# alternating, ratios printed (bench/compare_llama.sh --backend vulkan). Record its output in
# docs/performance.md ("Vulkan on a GPU").
#
# usage: bench/gpu_check.sh [--quick] [--allow-cpu-device]
#   --quick             the Q8_0 file only, one round, prompt 128 / generate 32
# Last, decode at position 100 with 512 and 32768 slots allocated (the rates should match).
#   --allow-cpu-device  run even when the only Vulkan device is a CPU implementation (lavapipe): a dry
#                       run of this script, not a GPU measurement
# Needs a built tree (`make build`), python3 with numpy (the fixture writer), node and npm, and about
# 10 GB of disk under build/fixtures. Environment: BUILD (default build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
specula="$build/bin/specula"
quick=0 allow_cpu=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --allow-cpu-device) allow_cpu=1 ;;
    *) sed -n 2,14p "$0" >&2; exit 2 ;;
  esac
done
[ -x "$specula" ] || { echo "gpu_check.sh: $specula not found; run 'make build' first" >&2; exit 1; }

# 1. The device: the backend prefers a discrete GPU, then an integrated one, then a CPU implementation.
device=$("$specula" bench --model "$root/models/specula-tiny-kjv-q8_0.gguf" --backend vulkan -p 8 -n 2 -r 1 \
  --no-drafter --json -q | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["device"])')
echo "Vulkan device: $device"
case "$device" in
  *llvmpipe*|*lavapipe*|*SwiftShader*)
    if [ "$allow_cpu" = 0 ]; then
      echo "gpu_check.sh: the only Vulkan device is a CPU implementation ($device); run this on a machine" \
           "with a GPU and its Vulkan driver (or pass --allow-cpu-device for a dry run)" >&2
      exit 1
    fi ;;
esac

# 2. Parity on that device: op conformance against the CPU backend, every target fixture format against
#    numpy / llama.cpp goldens and the CPU, greedy speculative decoding equal to plain decoding.
ctest --test-dir "$build" -R 'Vulkan' --output-on-failure

# 3. The peer: llama.cpp's Vulkan build next to the CPU one in tools/llama-ref (not saved in package.json).
if [ ! -d "$root/tools/llama-ref/node_modules/@node-llama-cpp/linux-x64-vulkan" ]; then
  (cd "$root/tools/llama-ref" && npm install --ignore-scripts --omit=optional --no-audit --no-fund >&2 &&
   npm install --no-save --ignore-scripts --omit=optional --no-audit --no-fund @node-llama-cpp/linux-x64-vulkan@3.22.1 >&2)
fi

# 4. Real-shape E2B files, written once.
out="$build/fixtures/gemma4-e2b-real"
/usr/bin/python3 "$root/tools/gemma4_fixture.py" --variant e2b-real --out "$out" --formats q8_0
files=("$out/model-q8_0.gguf")
if [ "$quick" = 0 ]; then
  [ -f "$out/model-q4_k_m.gguf" ] || "$specula" quantize "$out/model-q8_0.gguf" "$out/model-q4_k_m.gguf" Q4_K_M
  files+=("$out/model-q4_k_m.gguf")
fi

# 5. Specula (Vulkan) against llama.cpp (Vulkan), alternating rounds. The roofline line compares with the
#    host's memory bandwidth, not the GPU's: ignore it here.
for f in "${files[@]}"; do
  echo
  echo "== $(basename "$f")"
  if [ "$quick" = 1 ]; then
    "$root/bench/compare_llama.sh" "$f" --backend vulkan --prompt-tokens 128 --gen-tokens 32 --rounds 1 --verify 4
  else
    "$root/bench/compare_llama.sh" "$f" --backend vulkan --prompt-tokens 512 --gen-tokens 128 --rounds 2 --verify 4
  fi
done

# 6. Decode at position ~100 with 512 and 32768 slots allocated: attention reads only the slots in use,
#    so the two token rates should match (a cache-sized cost would show as a ratio well below 1).
f="${files[0]}"
tg() { "$specula" bench --model "$f" --backend vulkan -p 100 -n 32 -r 3 -c "$1" --no-drafter 2>/dev/null |
       awk '$1 == "tg32" { print $2 }'; }
small=$(tg 512) large=$(tg 32768)
echo
echo "== decode at position 100: $small tok/s with 512 slots, $large tok/s with 32768 ($(awk -v a="$large" -v b="$small" \
  'BEGIN { printf "%.2f", a / b }')x)"
