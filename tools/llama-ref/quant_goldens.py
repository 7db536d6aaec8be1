#!/usr/bin/python3
"""Golden blocks for Specula's block codecs, made by llama.cpp itself.

Loads ggml's base library from the node-llama-cpp prebuilt binaries (node_modules, git-ignored) and calls
its C API through ctypes:
  * ggml_quantize_chunk(type, ...)        -> llama.cpp's bytes for our float inputs
  * ggml_get_type_traits(type)->to_float  -> llama.cpp's dequantization of those bytes and of random blocks

Writes tests/formats/golden/<TYPE>.bin (little-endian):
  "SQG1", u32 ggml type, u32 n_quant, u32 n_rand,
  f32[n_quant] input, u8[] llama.cpp quantized input, f32[n_quant] llama.cpp dequantized,
  u8[] random blocks (finite f16 scale fields), f32[n_rand] llama.cpp dequantized.
Run: /usr/bin/python3 tools/llama-ref/quant_goldens.py   (from the repository root)
"""
import ctypes
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIB = os.path.join(HERE, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so")
OUT = os.path.join(ROOT, "tests/formats/golden")

# name, ggml id, block elements, block bytes, byte offsets of f16 fields inside a block
TYPES = [
    ("F32", 0, 1, 4, []),
    ("F16", 1, 1, 2, [0]),
    ("BF16", 30, 1, 2, []),
    ("Q4_0", 2, 32, 18, [0]),
    ("Q4_1", 3, 32, 20, [0, 2]),
    ("Q5_0", 6, 32, 22, [0]),
    ("Q5_1", 7, 32, 24, [0, 2]),
    ("Q8_0", 8, 32, 34, [0]),
    ("Q4_K", 12, 256, 144, [0, 2]),
    ("Q5_K", 13, 256, 176, [0, 2]),
    ("Q6_K", 14, 256, 210, [208]),
    ("IQ4_NL", 20, 32, 18, [0]),
    ("IQ4_XS", 23, 256, 136, [0]),
]


class TypeTraits(ctypes.Structure):
    # struct ggml_type_traits (ggml.h)
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def main():
    lib = ctypes.CDLL(LIB)
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261130)
    row = 256
    # Rows: normal, normal with outliers, uniform, mostly zeros with a few small values.
    x = np.zeros((4, row), dtype=np.float32)
    x[0] = rng.normal(0, 1, row)
    x[1] = rng.normal(0, 0.02, row)
    x[1, rng.integers(0, row, 6)] = rng.normal(0, 1.5, 6)
    x[2] = rng.uniform(-3, 1, row)
    x[3, rng.integers(0, row, 20)] = rng.normal(0, 1e-3, 20)
    x = x.reshape(-1)
    for name, tid, be, bb, half_fields in TYPES:
        tr = lib.ggml_get_type_traits(tid).contents
        assert tr.blck_size == be and tr.type_size == bb, (name, tr.blck_size, tr.type_size)
        to_float = TO_FLOAT(tr.to_float) if tr.to_float else None
        n = x.size
        qbytes = n // be * bb
        q = np.zeros(qbytes, dtype=np.uint8)
        written = lib.ggml_quantize_chunk(tid, x.ctypes.data, q.ctypes.data, 0, n // row, row, None)
        assert written == qbytes, (name, written, qbytes)
        deq = np.zeros(n, dtype=np.float32)
        if name == "F32":
            deq[:] = x  # F32 has no to_float; the copy is the reference
        else:
            to_float(q.ctypes.data, deq.ctypes.data, n)
        # Random blocks: any bits, but finite f16 scale fields (NaN payload handling is not a codec matter).
        n_rand = 1024
        r = rng.integers(0, 256, n_rand // be * bb, dtype=np.uint8)
        blocks = r.reshape(-1, bb)
        for off in half_fields:
            h = (rng.uniform(-2, 2, blocks.shape[0]) * np.exp2(rng.integers(-12, 2, blocks.shape[0]))).astype(np.float16)
            blocks[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
        if name == "BF16":
            v = r.view(np.uint16)
            v &= np.uint16(0xBFFF)  # clear the top exponent bit: no inf/NaN
        if name == "F32":
            v = r.view(np.uint32)
            v &= np.uint32(0xBFFFFFFF)
        rdeq = np.zeros(n_rand, dtype=np.float32)
        if name == "F32":
            rdeq[:] = r.view(np.float32)
        else:
            to_float(r.ctypes.data, rdeq.ctypes.data, n_rand)
        with open(os.path.join(OUT, f"{name}.bin"), "wb") as f:
            f.write(b"SQG1" + struct.pack("<III", tid, n, n_rand))
            f.write(x.tobytes() + q.tobytes() + deq.tobytes() + r.tobytes() + rdeq.tobytes())
        print(f"{name}: {n} quantized + {n_rand} random values")


if __name__ == "__main__":
    sys.exit(main())
