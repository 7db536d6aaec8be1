#!/usr/bin/python3
"""Goldens of `specula quantize` (tests/quantize/golden), made by llama.cpp's own quantizer.

Runs llama-quantize (the prebuilt llama.cpp of the peer tool: `llbench.sh quantize IN OUT FTYPE`, two
threads, no imatrix, no --allow-requantize) on Gemma 4 fixtures and records what it wrote:

  quant-f16.json   tools/gemma4_fixture.py --variant quant, F16, every file type Specula has: the output
                   tensor order, each tensor's type and data sha256 (first 16 hex digits), the sha256 of
                   the whole file and of its header (metadata + tensor infos), and for converted tensors
                   llama.cpp's relative RMS error against the input (rms(deq - in) / rms(in)).
  26b-f32-types.json   the "26b" fixture (MoE with 8 experts: the rules that look at expert_count), F32:
                   the tensor table (name, type, shape) and the type llama.cpp gave each tensor, per type.
  e2b-real-types.json  (`real` mode) the same for a real-shape file, from llama.cpp outputs made elsewhere
                   (quantizing 9 GB takes minutes): quantize_goldens.py real IN.gguf Q4_K_M=OUT.gguf ...

Run from the repository root:
    /usr/bin/python3 tools/llama-ref/quantize_goldens.py [--vocab VOCAB.gguf] [--work DIR]
    /usr/bin/python3 tools/llama-ref/quantize_goldens.py real /work/fixtures-real/model-f16.gguf Q4_K_M=a.gguf Q8_0=b.gguf
Needs llama.cpp's gguf-py (for dequantizing K-quants), found beside the llbench tool.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "quantize", "golden")
LLAMA = "/root/.cache/llama-bench-lite"
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(LLAMA, "llama.cpp", "gguf-py"))
import gemma4_fixture as g4  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# llama.cpp's file types that Specula writes (the numbers are general.file_type / LLAMA_FTYPE_*).
FTYPES = {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9,
          "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}
# ggml type id -> (name, block elements, block bytes)
GGML = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
        6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144),
        13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136)}
RULE_KEYS = ("block_count", "expert_count", "attention.head_count", "attention.head_count_kv")


def read_gguf(path):
    """(metadata of the scalar and numeric-array keys, [(name, type id, shape outermost-first, offset,
    nbytes)], data section offset, file bytes as a memmap)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    if bytes(buf[:4]) != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    off = 24
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def string(o):
        (n,) = struct.unpack_from("<Q", buf, o)
        return bytes(buf[o + 8: o + 8 + n]).decode("utf-8", "replace"), o + 8 + n

    def value(t, o):
        if t == 8:
            return string(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            if et in fmt:
                size = struct.calcsize(fmt[et])
                return list(struct.unpack_from(f"<{n}{fmt[et]}", buf, o)) if n < 4096 else None, o + size * n
            for _ in range(n):
                _, o = value(et, o)
            return None, o
        return struct.unpack_from("<" + fmt[t], buf, o)[0], o + struct.calcsize(fmt[t])

    md = {}
    for _ in range(n_kv):
        key, off = string(off)
        (t,) = struct.unpack_from("<I", buf, off)
        md[key], off = value(t, off + 4)
    infos = []
    for _ in range(n_tensors):
        name, off = string(off)
        (nd,) = struct.unpack_from("<I", buf, off)
        ne = struct.unpack_from(f"<{nd}Q", buf, off + 4)
        t, toff = struct.unpack_from("<IQ", buf, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 12
        _, be, bb = GGML[t]
        n = int(np.prod(ne))
        infos.append((name, t, list(reversed(ne)), toff, n // be * bb))
    align = md.get("general.alignment", 32)
    start = (off + align - 1) // align * align
    return md, infos, start, data


def tensor_bytes(data, start, info):
    return data[start + info[3]: start + info[3] + info[4]]


def to_f32(raw, ggml_type, shape):
    return dequantize(np.asarray(raw), GGMLQuantizationType(ggml_type)).reshape(-1).astype(np.float64)


def sha(b, n=64):
    return hashlib.sha256(b).hexdigest()[:n]


def llama_quantize(src, dst, ftype):
    subprocess.run([os.path.join(LLAMA, "llbench.sh"), "quantize", src, dst, str(ftype)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rule_metadata(md):
    arch = md.get("general.architecture")
    out = {"general.architecture": arch}
    for k in RULE_KEYS:
        if f"{arch}.{k}" in md:
            out[f"{arch}.{k}"] = md[f"{arch}.{k}"]
    return out


def types_golden(src, outputs, about):
    """The tensor table of `src` and, per file type, the order and types of llama.cpp's output."""
    md, infos, _, _ = read_gguf(src)
    index = {i[0]: n for n, i in enumerate(infos)}
    g = {"about": about, "metadata": rule_metadata(md),
         "tensors": [[name, GGML[t][0], shape] for name, t, shape, _, _ in infos], "ftypes": {}}
    for name, path in outputs.items():
        _, out_infos, _, _ = read_gguf(path)
        g["ftypes"][name] = {"ftype": FTYPES[name], "order": [index[i[0]] for i in out_infos],
                             "types": [GGML[i[1]][0] for i in out_infos]}
    return g


def parity_golden(src, work, about):
    md, infos, start, data = read_gguf(src)
    by_name = {i[0]: i for i in infos}
    g = {"about": about, "input_sha256": sha(open(src, "rb").read()), "tensors": None, "ftypes": {}}
    for name, ftype in FTYPES.items():
        out = os.path.join(work, f"llama-{name}.gguf")
        llama_quantize(src, out, ftype)
        _, oinfos, ostart, odata = read_gguf(out)
        names = [i[0] for i in oinfos]
        assert g["tensors"] in (None, names), "llama.cpp's tensor order depends on the type"
        g["tensors"] = names
        entry = {"ftype": ftype, "file_sha256": sha(bytes(odata)), "header_sha256": sha(bytes(odata[:ostart])),
                 "types": [], "data_sha256": [], "rel_rms_error": []}
        for info in oinfos:
            src_info = by_name[info[0]]
            raw = tensor_bytes(odata, ostart, info)
            entry["types"].append(GGML[info[1]][0])
            entry["data_sha256"].append(sha(bytes(raw), 16))
            err = None
            if info[1] != src_info[1]:
                x = to_f32(tensor_bytes(data, start, src_info), src_info[1], src_info[2])
                y = to_f32(raw, info[1], info[2])
                err = float(f"{np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)):.6g}")
            entry["rel_rms_error"].append(err)
        g["ftypes"][name] = entry
        os.remove(out)
        print(f"  {name}: {sum(e is not None for e in entry['rel_rms_error'])} tensors converted", flush=True)
    return g


def write(name, g):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), "w") as fh:
        json.dump(g, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {os.path.join(OUT, name)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="fixtures", choices=["fixtures", "real"])
    ap.add_argument("real", nargs="*", help="real mode: IN.gguf TYPE=llama.cpp-output.gguf ...")
    ap.add_argument("--vocab", default=g4.DEFAULT_VOCAB)
    ap.add_argument("--work", default="/tmp/specula-quantize-goldens")
    a = ap.parse_args()
    tool = "llama.cpp llama-quantize (node-llama-cpp 3.22.1 prebuilt, llbench.sh quantize, 2 threads)"
    if a.mode == "real":
        src, pairs = a.real[0], dict(p.split("=", 1) for p in a.real[1:])
        write("e2b-real-types.json", types_golden(src, pairs, f"{tool} on tools/gemma4_fixture.py --variant "
                                                              "e2b-real --formats f16"))
        return
    os.makedirs(a.work, exist_ok=True)
    quant = os.path.join(a.work, "quant")
    g4.generate("quant", quant, ["f16"], a.vocab)
    print("quant fixture, F16:")
    write("quant-f16.json", parity_golden(os.path.join(quant, "model-f16.gguf"), a.work,
                                          f"{tool} on tools/gemma4_fixture.py --variant quant --formats f16"))
    moe = os.path.join(a.work, "26b")
    g4.generate("26b", moe, ["f32"], a.vocab)
    src = os.path.join(moe, "model-f32.gguf")
    outputs = {}
    for name, ftype in FTYPES.items():
        outputs[name] = os.path.join(a.work, f"llama-26b-{name}.gguf")
        llama_quantize(src, outputs[name], ftype)
    write("26b-f32-types.json", types_golden(src, outputs, f"{tool} on tools/gemma4_fixture.py --variant 26b "
                                                           "--formats f32"))
    for path in outputs.values():
        os.remove(path)


if __name__ == "__main__":
    main()
