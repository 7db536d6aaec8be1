#!/usr/bin/env bash
# The Vulkan backend on a real GPU, in one run that fits a short lease: the device and its capabilities,
# the Vulkan test suites on it, then real-shape Gemma 4 E2B files (random weights, written here: Q8_0,
# and Q4_K_M from Specula's quantizer) measured as `specula bench` measures (pp, tg at the prompt's
# depth, verification of 2..9 tokens, a per-op GPU profile) next to llama.cpp's Vulkan build measured
# the same way (bench/gpu/llama_peer.cpp: node-llama-cpp 3.22.1's prebuilt, every layer on the GPU).
# Every figure goes to gpu_check.json, with the logs beside it, in $OUT (the device tool's folder that
# comes back) or build/gpu-check; docs/performance.md ("Vulkan on a GPU") records them.
#
# usage: bench/gpu_check.sh [--bundle DIR] [--quick] [--budget SECONDS] [--allow-cpu-device]
#   --bundle DIR   run from DIR/bundle.tar.xz (bench/gpu/bundle.sh), on a machine without a build, Debian's
#                  libraries or a network; it is unpacked into build/ here (the tests' compiled-in paths
#                  are the bundling checkout's, /work/main: linked to this checkout when they differ)
#   --quick        the Q8_0 file only, one round, prompt 128 / generate 32, no profile
#   --budget S     skip what would start after S seconds (default 480: a 10-minute lease call with room)
#   --allow-cpu-device  run even when the only Vulkan device is a CPU implementation (lavapipe): a dry run
#                  of this script, not a GPU measurement
#   --variant V    the tools/gemma4_fixture.py variant measured (default e2b-real; e2b for a dry run)
#   --no-tests     skip the test suites
#   --rounds R     alternating rounds of the two engines (default 2; 1 with --quick)
# On the lent machines (docs/performance.md says how): carry .gl (the Vulkan loader packages) and .gpu,
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; bench/gpu_check.sh --bundle .gpu
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bundle="" quick=0 allow_cpu=0 budget=480 variant=e2b-real tests=1 rounds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$(cd "$2" && pwd)"; shift ;;
    --quick) quick=1 ;;
    --budget) budget="$2"; shift ;;
    --allow-cpu-device) allow_cpu=1 ;;
    --variant) variant="$2"; shift ;;
    --no-tests) tests=0 ;;
    --rounds) rounds="$2"; shift ;;
    *) sed -n 2,24p "$0" >&2; exit 2 ;;
  esac
  shift
done
# What comes back: gpu_check.log as it grows, raw.tar (every measurement's file, packed again after each
# step, so that a run cut short still returns what it measured), then gpu_check.json and summary.txt.
dest="${OUT:-$root/build/gpu-check}"
mkdir -p "$dest"
out=$(mktemp -d)
exec > >(tee -a "$dest/gpu_check.log") 2>&1
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
left() { [ "$SECONDS" -lt "$budget" ]; }
save() { tar -C "$out" -cf "$dest/raw.tar.tmp" . && mv "$dest/raw.tar.tmp" "$dest/raw.tar"; }

# 1. The tree: a bundle unpacked where the tests look for it, or this checkout's build.
if [ -n "$bundle" ]; then
  log "unpacking $bundle/bundle.tar.xz"
  tar -C "$root" -xJf "$bundle/bundle.tar.xz" 2> /dev/null ||  # without xz: Python's lzma
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle/bundle.tar.xz" "$root" ||
    { log "cannot unpack the bundle"; exit 1; }
  mkdir -p "$root/build"
  [ -e /work/main ] || { mkdir -p /work && ln -s "$root" /work/main; }
  [ -e /work/shared ] || ln -s "$root/shared" /work/shared
  export LD_LIBRARY_PATH="$root/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The tests and fixture writers run /usr/bin/python3 and need numpy; this machine's numpy may be in
  # another python3 (a virtual environment first on PATH).
  if ! /usr/bin/python3 -c 'import numpy' 2> /dev/null; then
    py=$(command -v python3)
    if [ -n "$py" ] && "$py" -c 'import numpy' 2> /dev/null && [ -w /usr/bin ]; then
      [ -e /usr/bin/python3 ] && mv /usr/bin/python3 /usr/bin/python3.without-numpy
      printf '#!/bin/sh\nexec %s "$@"\n' "$py" > /usr/bin/python3 && chmod +x /usr/bin/python3
      log "/usr/bin/python3 now runs $py (numpy $("$py" -c 'import numpy; print(numpy.__version__)'))"
    fi
  fi
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
build="$root/build"
specula="$build/bin/specula"
[ -x "$specula" ] || { log "$specula not found: run 'make build' or pass --bundle"; exit 1; }
peer="$build/llama/llama_peer"
[ -x "$peer" ] || peer=""
py=/usr/bin/python3
threads=$(nproc)

# 2. The machine and the device.
{ nvidia-smi 2>&1 | head -20; echo; lscpu | head -20; echo; vulkaninfo 2>&1; } > "$out/device.txt"
device=$("$specula" bench --model "$root/models/specula-tiny-kjv-q8_0.gguf" --backend vulkan -p 8 -n 2 -r 1 \
  --no-drafter --json -q 2> "$out/device_err.txt" | $py -c 'import json, sys; print(json.load(sys.stdin)["device"])')
log "Vulkan device: ${device:-none} ($(grep -m1 -E 'deviceName|GPU id' "$out/device.txt" | xargs))"
case "$device" in
  "") log "no Vulkan device: $(tail -3 "$out/device_err.txt")"; exit 1 ;;
  *llvmpipe*|*lavapipe*|*SwiftShader*)
    if [ "$allow_cpu" = 0 ]; then
      log "the only Vulkan device is a CPU implementation ($device); run this where a GPU and its Vulkan driver" \
          "are (or pass --allow-cpu-device for a dry run)"
      exit 1
    fi ;;
esac
save

# 3. The Vulkan suites on this device: every op against the CPU backend, the gemma4 target against the
#    goldens and the CPU, speculative rounds equal to plain decoding.
#    The op conformance suites too (tests/backend on Vulkan, against their independent references).
: > "$out/tests.txt"
for t in vulkan/vulkan_tests vulkan/vulkan_gemma4_tests backend/backend_tests; do
  [ "$tests" = 1 ] && left || break
  name=$(basename "$t")
  log "tests: $name"
  filter='*'
  [ "$name" = backend_tests ] && filter='Ops.*:Attention.*:Float/MatMulTypes.*:Blocks/QuantMatMul.*:SamplingOps.*:KvCache.*'
  SPECULA_TEST_BACKEND=$([ "$name" = backend_tests ] && echo vulkan) SPECULA_PLUGIN_PATH= timeout 300 "$build/tests/$t" \
    --gtest_filter="$filter" --gtest_output="json:$out/$name.json" >> "$out/tests.txt" 2>&1
  log "tests: $name exited $? ($(grep -E '^\[  (PASSED|FAILED)  \]' "$out/tests.txt" | tail -1))"
  save
done

# 4. Real-shape files, written here (every core; tools/gemma4_fixture.py draws each tensor on its own).
fx="$build/fixtures/gemma4-$variant"
log "writing the $variant Q8_0 file"
$py "$root/tools/gemma4_fixture.py" --variant "$variant" --out "$fx" --formats q8_0 || { log "fixture failed"; exit 1; }
files=("$fx/model-q8_0.gguf")
if [ "$quick" = 0 ]; then
  log "quantizing it to Q4_K_M"
  [ -f "$fx/model-q4_k_m.gguf" ] ||
    "$specula" quantize "$fx/model-q8_0.gguf" "$fx/model-q4_k_m.gguf" Q4_K_M > "$out/quantize.txt" 2>&1 || log "quantize failed"
  [ -f "$fx/model-q4_k_m.gguf" ] && files=("$fx/model-q4_k_m.gguf" "${files[@]}")
fi
log "files ready: $(ls -la "$fx" | awk '/gguf/ { printf "%s %.1f GB; ", $NF, $5 / 1e9 }')"

# 5. Specula (Vulkan) and llama.cpp (Vulkan), alternating, one JSON per measurement.
if [ "$quick" = 1 ]; then pp=128 tg=32 rounds=${rounds:-1}; else pp=512 tg=128 rounds=${rounds:-2}; fi
ctx=4096  # llama.cpp's n_ctx here; the small test variants hold 256 tokens
case "$variant" in *-real) ;; *) ctx=256 ;; esac
for r in $(seq "$rounds"); do
  for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    left || break 2
    log "round $r: specula $name"
    "$specula" bench --model "$f" --backend vulkan -p "$pp" -n "$tg" -r 3 --context-length "$ctx" --no-drafter --verify \
      --json -q > "$out/specula.$name.$r.json" 2>> "$out/bench_err.txt" || log "specula bench failed: $(tail -2 "$out/bench_err.txt")"
    # Where the time goes, in the first round (a short lease may end before the rest): per-op GPU time of
    # a prompt and of decode steps, from timestamps around each dispatch.
    if [ "$r" = 1 ] && [ "$quick" = 0 ]; then
      log "profile: $name"
      echo "== $name" >> "$out/profile.txt"
      "$specula" bench --model "$f" --backend vulkan -p "$pp" -n 32 -r 1 --context-length "$ctx" --no-drafter --profile -q \
        >> "$out/profile.txt" 2>&1 || log "profile failed"
    fi
    left || break 2
    if [ -n "$peer" ]; then
      log "round $r: llama.cpp $name"
      LLBINS="$build/llama" "$peer" "$f" --pp "$pp" --tg "$tg" --reps 3 --verify 2,3,4,5,9 --threads "$threads" \
        > "$out/llama.$name.$r.json" 2>> "$out/bench_err.txt" || log "llama_peer failed: $(tail -2 "$out/bench_err.txt")"
    fi
    save
  done
done

# 5b. Prefill on the fp32 shaders (option cooperative_matrix: false), against the default just measured.
for f in "${files[@]}"; do
  left || break
  name=$(basename "$f" .gguf)
  printf 'backend:\n  plugin: vulkan\n  options: {cooperative_matrix: false}\ntarget:\n  model: %s\n' "$f" > "$out/fp32.yaml"
  log "specula $name, prefill without cooperative matrices"
  "$specula" bench "$out/fp32.yaml" -p "$pp" -n 4 -r 3 --context-length "$ctx" --no-drafter --json -q \
    > "$out/fp32.$name.json" 2>> "$out/bench_err.txt" || log "fp32 bench failed"
  save
done

# 7. The figures in one JSON and a table.
export GPU_CHECK_DEST="$dest"
$py - "$out" "$device" <<'PY' | tee "$dest/summary.txt"
import glob, json, os, re, sys
out, device = sys.argv[1], sys.argv[2]
def load(p):
    try:
        t = open(p).read()
        return json.loads(t[t.index("{"):])
    except Exception:
        return None
res = {"device": device, "machine": open(os.path.join(out, "device.txt")).read()[:4000], "tests": {}, "files": {}}
for t in ("vulkan_tests", "vulkan_gemma4_tests", "backend_tests"):
    j = load(os.path.join(out, t + ".json"))
    if j: res["tests"][t] = {k: j.get(k) for k in ("tests", "failures", "disabled", "errors", "time")}
    if j: res["tests"][t]["failed"] = [f"{s['name']}.{c['name']}" for s in j.get("testsuites", []) for c in s.get("testsuite", []) if c.get("failures")]
for p in sorted(glob.glob(os.path.join(out, "specula.*.json")) + glob.glob(os.path.join(out, "llama.*.json"))):
    engine, name, r = os.path.basename(p)[:-5].split(".")
    j = load(p)
    if j: res["files"].setdefault(name, {}).setdefault(engine, []).append(j)
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
print(f"device: {device}")
for t, v in res["tests"].items():
    print(f"{t}: {v['tests']} tests, {v['failures']} failed {v['failed'][:10]}")
for name, e in res["files"].items():
    s, l = e.get("specula", []), e.get("llama", [])
    print(f"== {name}\n{'':16}{'specula':>10}{'llama.cpp':>11}{'ratio':>8}")
    def row(label, a, b, f="{:10.1f}"):
        print(f"{label:16}" + (f.format(a) if a == a else f"{'-':>10}") + " " + (f.format(b) if b == b else f"{'-':>10}")
              + (f"{a / b:8.2f}" if a == a and b == b and b else ""))
    row("pp tok/s", med([j["pp_tokens_per_second"] for j in s]), med([j["pp_tok_s"] for j in l]))
    row("tg tok/s", med([j["tg_tokens_per_second"] for j in s]), med([j["tg_tok_s"] for j in l]))
    fp32 = load(os.path.join(out, f"fp32.{name}.json"))
    if fp32:
        res["files"][name]["specula_fp32_pp"] = fp32["pp_tokens_per_second"]
        row("pp fp32 shaders", fp32["pp_tokens_per_second"], med([j["pp_tok_s"] for j in l]))
    for v in (2, 3, 4, 5, 9):
        a = med([c["verify_steps"] for j in s for c in (j.get("verify_costs") or []) if c["draft_tokens"] + 1 == v])
        b = med([c["steps"] for j in l for c in j.get("verify", []) if c["tokens"] == v])
        row(f"verify({v}) steps", a, b, "{:10.2f}")
json.dump(res, open(os.path.join(os.environ["GPU_CHECK_DEST"], "gpu_check.json"), "w"), indent=1)
PY
save
log "done: $(ls "$dest" | tr '\n' ' ')"
