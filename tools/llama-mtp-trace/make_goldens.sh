#!/bin/sh
# Regenerates tests/gemma4_assistant/golden/llamacpp-mtp/*.jsonl with llama.cpp's draft-mtp
# (llama-mtp-trace, built here), greedy, K = 1..4 draft tokens, on
#   fixture-kK: the e2b F32 target fixture + its F32 assistant (llama.cpp's upstream schema), the 21-token
#               prompt of golden/e2b-assistant.json (longer than the sliding window of 8), 6 tokens;
#   tiny-kK:    the shipped tiny KJV pair (Q8_0), its assistant rewritten to the upstream schema
#               (seed_to_upstream.py: same tensor bytes, dense head), a chat prompt, 24 tokens.
# usage: tools/llama-mtp-trace/make_goldens.sh [WORK_DIR]   (default /work/llama-build)
set -e
py=${PYTHON:-/usr/bin/python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/work/llama-build}
vocab=${SPECULA_VOCAB:-$root/../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf}
[ -f "$vocab" ] || vocab=/work/shared/gemma4-vocab/ggml-vocab-gemma-4.gguf
out=$root/tests/gemma4_assistant/golden/llamacpp-mtp
trace=$("$root/tools/llama-mtp-trace/build.sh" "$work" | tail -n1)
mkdir -p "$out" "$work/fx"
"$py" "$root/tools/gemma4_fixture.py" --variant e2b --formats f32 --out "$work/fx" --vocab "$vocab"
"$py" "$root/tools/gemma4_assistant_fixture.py" --out "$work/fx" --vocab "$vocab"
"$py" "$root/tools/llama-mtp-trace/seed_to_upstream.py" "$root/models/specula-tiny-kjv-assistant-q8_0.gguf" \
  "$work/tiny-assistant-upstream.gguf"
fixture_ids=2,818,5279,529,7001,563,1401,236764,8521,672,531,9405,4372,236761,1018,2365,531,1464,8908,496,3925
# <bos><|turn>user\nAnd God said, Let there be light: and there was light.<turn|>\n<|turn>model\n
tiny_ids=2,105,603,107,507,586,733,1391,589,499,1220,390,471,589,590,1220,378,106,107,105,605,107
common="--spec-type draft-mtp --temp 0 -ctk f32 -ctv f32 -c 256 -t 1"
for k in 1 2 3 4; do
  "$trace" --ids $fixture_ids --trace "$out/fixture-k$k.jsonl" -m "$work/fx/model-f32.gguf" \
    -md "$work/fx/assistant-f32.gguf" --spec-draft-n-max $k -n 6 $common > "$work/fixture-k$k.log" 2>&1
  "$trace" --ids $tiny_ids --trace "$out/tiny-k$k.jsonl" -m "$root/models/specula-tiny-kjv-q8_0.gguf" \
    -md "$work/tiny-assistant-upstream.gguf" --spec-draft-n-max $k -n 24 $common > "$work/tiny-k$k.log" 2>&1
done
ls -l "$out"
