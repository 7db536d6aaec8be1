#!/usr/bin/env python3
"""Rewrites a gemma4-assistant GGUF of the seed schema (assist_* tensors, centroid head) into llama.cpp's
upstream schema, tensor bytes unchanged, so that llama.cpp loads the very weights Specula runs.

  assist_pre_proj.weight   -> nextn.pre_projection.weight
  assist_post_proj.weight  -> nextn.post_projection.weight
  assist_embed_centroids.weight, assist_token_ordering.weight: dropped (llama.cpp uses the dense head)
  gemma4-assistant.backbone_hidden_size -> gemma4-assistant.embedding_length_out
  gemma4-assistant.assistant.*: dropped

A development tool for the llama.cpp goldens (README.md here); it uses gguf-py from the llama.cpp
source tree. usage: seed_to_upstream.py IN.gguf OUT.gguf [--llama-src DIR]
"""
import argparse
import os
import sys

ARCH = "gemma4-assistant"
RENAME = {"assist_pre_proj.weight": "nextn.pre_projection.weight",
          "assist_post_proj.weight": "nextn.post_projection.weight"}
DROP = {"assist_embed_centroids.weight", "assist_token_ordering.weight"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--llama-src", default="/root/.cache/llama-bench-lite/llama.cpp")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.llama_src, "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(a.src)
    arch = reader.fields["general.architecture"].contents()
    if arch != ARCH:
        sys.exit(f"{a.src}: general.architecture is '{arch}', expected '{ARCH}'")
    names = {t.name for t in reader.tensors}
    if not set(RENAME) <= names:
        sys.exit(f"{a.src}: not the seed schema (needs {', '.join(sorted(RENAME))})")
    writer = gguf.GGUFWriter(a.out, ARCH)
    for field in reader.fields.values():
        name = field.name
        if name == "general.architecture" or name.startswith("GGUF.") or name.startswith(f"{ARCH}.assistant."):
            continue
        if name == f"{ARCH}.backbone_hidden_size":
            name = f"{ARCH}.embedding_length_out"
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    kept = [t for t in reader.tensors if t.name not in DROP]
    for t in kept:
        writer.add_tensor_info(RENAME.get(t.name, t.name), t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


if __name__ == "__main__":
    main()
