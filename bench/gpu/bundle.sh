#!/usr/bin/env bash
# Packs, from a built tree, everything bench/gpu_check.sh needs on a GPU machine that has none of
# Debian's libraries, no Vulkan development files and no network (the lent NVIDIA machines: a CUDA
# image with Python and numpy, nothing else of ours). One archive, .gpu/bundle.tar.xz (about 30 MB):
#   build/bin/specula, build/plugins/*.so, the test executables with Vulkan suites (stripped of debug
#                      information)
#   build/lib/         the shared libraries they load beyond glibc and libstdc++ (Boost, fmt, yaml-cpp,
#                      oneDNN, curl, the Vulkan loader, ...), found with ldd
#   build/bin/vulkaninfo
#   build/llama/       llama.cpp's Vulkan build (node-llama-cpp 3.22.1's prebuilt libraries, llama.cpp
#                      v0.5.0) and bench/gpu/llama_peer.cpp compiled against it, next to each other
#   shared/gemma4-vocab/   the tokenizer the fixture writers and tests read
# The machine runs bench/gpu_check.sh --bundle .gpu (that script says how), with .gpu in the device
# tool's carry list.
#
# usage: bench/gpu/bundle.sh [OUT_DIR]     (default .gpu; BUILD: the built tree, default build)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD:-$root/build}"
out="${1:-$root/.gpu}"
shared="${SPECULA_SHARED_DIR:-$root/../shared}"
for f in "$build/bin/specula" "$build/tests/vulkan/vulkan_tests" "$build/tests/vulkan/vulkan_gemma4_tests" \
         "$build/tests/backend/backend_tests"; do
  [ -x "$f" ] || { echo "bundle.sh: $f not found; run 'make build' first" >&2; exit 1; }
done
command -v vulkaninfo > /dev/null || { echo "bundle.sh: vulkaninfo not found (Debian package vulkan-tools)" >&2; exit 1; }

# llama.cpp's Vulkan build: the npm prebuilt and the headers of the source it was built from.
ll="${LLAMA_VULKAN_DIR:-$HOME/.cache/specula-llama-vulkan}"
if [ ! -d "$ll/node_modules/@node-llama-cpp/linux-x64-vulkan" ]; then
  mkdir -p "$ll"
  (cd "$ll" && npm install --no-save --ignore-scripts --omit=optional --no-audit --no-fund \
     node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64-vulkan@3.22.1 >&2)
fi
[ -d "$ll/llama.cpp/include" ] || git clone -q "$ll/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$ll/llama.cpp" 2> /dev/null
bins="$ll/node_modules/@node-llama-cpp/linux-x64-vulkan/bins/linux-x64-vulkan"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bin" "$stage/build/plugins" "$stage/build/tests/vulkan" "$stage/build/tests/backend" \
  "$stage/build/lib" "$stage/build/llama" "$stage/shared"
cp "$build/bin/specula" "$stage/build/bin/"
cp "$build"/plugins/*.so "$stage/build/plugins/"
cp "$build/tests/vulkan/vulkan_tests" "$build/tests/vulkan/vulkan_gemma4_tests" "$stage/build/tests/vulkan/"
cp "$build/tests/backend/backend_tests" "$stage/build/tests/backend/"
cp "$(command -v vulkaninfo)" "$stage/build/bin/"
find "$stage/build" -type f \( -name '*.so' -o -perm -u+x \) -exec strip --strip-debug {} +

# llama.cpp: its libraries (the CPU variants a server CPU picks from, the Vulkan backend) and the peer.
for f in libggml-base.so libggml.vulkan.v0.5.0.so libllama.vulkan.v0.5.0.so libggml-vulkan.so \
         libggml-cpu-x64.so libggml-cpu-haswell.so libggml-cpu-skylakex.so libggml-cpu-icelake.so \
         libggml-cpu-sapphirerapids.so libggml-cpu-zen4.so; do
  cp "$bins/$f" "$stage/build/llama/"
done
g++ -O2 -std=c++17 "$root/bench/gpu/llama_peer.cpp" -I"$ll/llama.cpp/include" -I"$ll/llama.cpp/ggml/include" \
  "$stage/build/llama/libllama.vulkan.v0.5.0.so" "$stage/build/llama/libggml.vulkan.v0.5.0.so" \
  "$stage/build/llama/libggml-base.so" -Wl,-rpath,'$ORIGIN' -o "$stage/build/llama/llama_peer"

# Shared libraries beyond glibc and libstdc++ (the machine has its own, newer ones), resolved here.
libs=$(for f in "$stage"/build/bin/* "$stage"/build/plugins/*.so "$stage"/build/tests/*/* "$stage"/build/llama/*.so; do
         LD_LIBRARY_PATH="$stage/build/llama" ldd "$f" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
       done | sort -u)
for l in $libs; do
  case "$(basename "$l")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    "$stage"*) ;;
    *) [[ "$l" == "$stage"* ]] || cp -L "$l" "$stage/build/lib/" ;;
  esac
done
cp -L /usr/lib/x86_64-linux-gnu/libvulkan.so.1 "$stage/build/lib/"
cp -r "$shared/gemma4-vocab" "$stage/shared/"
(cd "$root" && git rev-parse HEAD && git status --short) > "$stage/build/BUNDLE_COMMIT"

mkdir -p "$out"
tar -C "$stage" -cf - build shared | xz -T0 -6 > "$out/bundle.tar.xz.tmp"
mv "$out/bundle.tar.xz.tmp" "$out/bundle.tar.xz"
echo "bundle.sh: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)); the libraries: $(ls "$stage/build/lib" | tr '\n' ' ')"
