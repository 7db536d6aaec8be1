#!/bin/sh
# Builds llama-mtp-trace against node-llama-cpp's prebuilt llama.cpp (v0.5.0): the headers of the
# llama.cpp source of the same release, the libraries of its linux-x64 bundle. One g++ call, ~10 s.
# usage: tools/llama-mtp-trace/build.sh [OUT_DIR]   (default /work/llama-build); prints the binary's path.
set -e
src=${LLAMA_SRC:-/root/.cache/llama-bench-lite/llama.cpp}
bins=${LLAMA_BINS:-/root/.cache/llama-bench-lite/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
out=${1:-/work/llama-build}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# The prebuilt libggml loads its CPU variants at run time: LLAMA_BINS is compiled in for that.
g++ -std=c++17 -O2 -Wall -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
  -DLLAMA_BINS="\"$bins\"" "$here/llama_mtp_trace.cpp" -o "$out/llama-mtp-trace" \
  -L"$bins" -l:libllama-common.so -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,"$bins"
echo "$out/llama-mtp-trace"
