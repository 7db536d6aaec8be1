#!/usr/bin/python3
"""Writes the initial fuzz seeds (small valid and near-valid GGUF and safetensors files) into
tests/fuzz/corpus/{gguf,safetensors}. The fuzzers grow the corpus from these; the kept corpus is
minimised with libFuzzer's -merge=1 (see docs/formats.md)."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def gguf(kvs, tensors, alignment=32, version=3):
    """tensors: (name, ne innermost-first, ggml type, raw bytes)"""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    off = 0
    infos = b""
    for name, ne, t, data in tensors:
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", t, off)
        off += (len(data) + alignment - 1) // alignment * alignment
    out += infos
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % alignment)
    return out


def st(entries, metadata=None, pad=True):
    """entries: (name, dtype, shape, raw bytes)"""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, data in entries:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(d for *_, d in entries)


def main():
    gdir = os.path.join(HERE, "corpus/gguf")
    sdir = os.path.join(HERE, "corpus/safetensors")
    os.makedirs(gdir, exist_ok=True)
    os.makedirs(sdir, exist_ok=True)
    all_types = [
        kv("general.architecture", 8, gstr("gemma4")),
        kv("u8", 0, b"\x07"), kv("i8", 1, b"\xf9"), kv("u16", 2, struct.pack("<H", 7)),
        kv("i16", 3, struct.pack("<h", -7)), kv("u32", 4, struct.pack("<I", 7)), kv("i32", 5, struct.pack("<i", -7)),
        kv("f32", 6, struct.pack("<f", 0.5)), kv("bool", 7, b"\x01"), kv("u64", 10, struct.pack("<Q", 7)),
        kv("i64", 11, struct.pack("<q", -7)), kv("f64", 12, struct.pack("<d", 0.25)),
        kv("tokens", 9, struct.pack("<IQ", 8, 3) + gstr("<pad>") + gstr("<eos>") + gstr("<bos>")),
        kv("types", 9, struct.pack("<IQ", 5, 3) + struct.pack("<iii", 3, 3, 1)),
        kv("pattern", 9, struct.pack("<IQ", 7, 4) + b"\x01\x01\x00\x01"),
    ]
    f32 = struct.pack("<8f", *range(8))
    q8 = struct.pack("<e", 0.1) + bytes(range(32))
    q4k = struct.pack("<ee", 0.01, 0.002) + bytes(range(12)) + bytes((i * 7) & 255 for i in range(128))
    q6k = bytes((i * 13) & 255 for i in range(192)) + bytes([1, 255] * 8)[:16] + struct.pack("<e", 0.03)
    q6k = q6k[:192] + bytes([3, 250, 7, 9, 11, 200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) + struct.pack("<e", 0.03)
    seeds = {
        "empty-kv": gguf([], []),
        "all-value-types": gguf(all_types, []),
        "tensors-f32-q8": gguf(all_types[:2], [("a", [8], 0, f32), ("b.weight", [32, 1], 8, q8)]),
        "tensors-kquants": gguf([], [("q4k", [256], 12, q4k), ("q6k", [256], 14, q6k), ("c", [2, 2, 2], 0, f32)]),
        "alignment-64": gguf([kv("general.alignment", 4, struct.pack("<I", 64))],
                             [("a", [8], 0, f32), ("b", [4], 0, f32[:16])], alignment=64),
        "split-shard": gguf([kv("split.no", 2, struct.pack("<H", 0)), kv("split.count", 2, struct.pack("<H", 2)),
                             kv("split.tensors.count", 5, struct.pack("<i", 3))], [("a", [8], 0, f32)]),
        "iq4": gguf([], [("nl", [32], 20, struct.pack("<e", 0.5) + bytes(range(16))),
                         ("xs", [256], 23, struct.pack("<eH", 0.5, 0xABCD) + bytes(range(4)) + bytes(range(128)))]),
        "bf16-f16": gguf([], [("h", [4], 1, struct.pack("<4e", 1, 2, 3, 4)), ("bf", [4], 30, b"\x80\x3f" * 4)]),
    }
    for name, data in seeds.items():
        with open(os.path.join(gdir, "seed-" + name), "wb") as f:
            f.write(data)
    bf = b"\x80\x3f" * 6
    st_seeds = {
        "rust-padded": st([("model.embed.weight", "BF16", [2, 3], bf), ("ord", "I64", [2], struct.pack("<qq", 1, 0))],
                          {"format": "pt"}),
        "mlx-unpadded": st([("a.biases", "BF16", [1, 1], b"\0\0"), ("a.scales", "BF16", [1, 1], b"\x80\x3f"),
                            ("a.weight", "U32", [1, 8], bytes(32))], {"format": "mlx"}, pad=False),
        "all-dtypes": st([(n, d, [2], b"\x01" * (2 * s)) for n, d, s in
                          [("f32", "F32", 4), ("f16", "F16", 2), ("bf16", "BF16", 2), ("f64", "F64", 8),
                           ("i8", "I8", 1), ("i16", "I16", 2), ("i32", "I32", 4), ("i64", "I64", 8),
                           ("u8", "U8", 1), ("u32", "U32", 4), ("bool", "BOOL", 1)]]),
        "scalar-and-empty": st([("s", "F32", [], struct.pack("<f", 2.0)), ("e", "F32", [0, 3], b"")]),
        "no-tensors": st([], {"format": "pt"}),
        "bad-dtype": st([("x", "F8_E4M3", [2], b"\0\0")]),
    }
    for name, data in st_seeds.items():
        with open(os.path.join(sdir, "seed-" + name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} GGUF and {len(st_seeds)} safetensors seeds written")


if __name__ == "__main__":
    main()
