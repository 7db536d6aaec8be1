#!/usr/bin/env python3
"""Deterministic random-weight Gemma 4 text checkpoints for tests and benchmarks.

Writes one model in the layouts real downloads use:
  model-f32.gguf, model-f16.gguf, model-q8_0.gguf   (llama.cpp converter layout, gemma4 arch)
  hf/            config.json (nested text_config) + model.safetensors (BF16, model.language_model.*)
  mlx4/, mlx8/   mlx-vlm layout (language_model.model.*, affine 4/8-bit, router at 8 bit)
  mlx4-ref-f32.gguf, mlx8-ref-f32.gguf   the MLX weights dequantized, as F32 GGUF: the llama.cpp
                 reference for the MLX files (so MLX is checked exactly, not "within quantization")
  hf-tok/, hf-sharded/, mlx4-tok/   for `specula convert`: hf and mlx4 with tokenizer.json and
                 tokenizer_config.json made from the vocab GGUF's tokenizer keys (which llama.cpp's
                 converter wrote from the real Gemma 4 tokenizer.json), hf-sharded in two shards with
                 model.safetensors.index.json

Every weight is rounded to bfloat16 first, so F32 GGUF, F16 GGUF and BF16 safetensors hold the very
same numbers. The tokenizer metadata (full 262144-token Gemma 4 vocab) is copied from the vocab GGUF
in shared/, because llama.cpp refuses a gemma4 file without it; the embedding tables therefore have
262144 rows, and the tiny hidden sizes keep the files small (tens of MB).

Output is bit-for-bit reproducible (seeded numpy Generator), so committed goldens stay valid.
The "-real" variants (real shapes, for benchmarks) draw each tensor from its own generator, seeded by
the variant seed and the tensor name, in row chunks at write time: the GGUF writers stream them with
little memory (the HF and MLX writers still hold a whole file in memory).
A stamp file lets repeated calls return at once.

usage: gemma4_fixture.py --variant e2b --out DIR [--formats f32,f16,q8_0,hf,mlx4,mlx8,mlx4-ref,mlx8-ref,hf-tok,
                         hf-sharded,mlx4-tok] [--vocab GGUF]
       gemma4_fixture.py --list
"""
import argparse
import fcntl
import hashlib
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VOCAB = os.path.join(HERE, "..", "..", "shared", "gemma4-vocab", "ggml-vocab-gemma-4.gguf")

S, F = "sliding_attention", "full_attention"

# Tiny shapes of each published variant: the same features, a window (8/16) that a 40-token sequence
# crosses, and KV-sharing tails whose producers are (sliding, full) as in E2B/E4B.
VARIANTS = {
    "e2b": dict(hidden=64, layers=[S, S, F, S, S, F], heads=2, kv=1, kv_global=None, k_eq_v=False,
                ffn=64, double_wide=True, shared=3, ple=16, window=8, moe=None, seed=2),
    "e4b": dict(hidden=64, layers=[S, S, S, F, S, S, S, F], heads=4, kv=2, kv_global=None, k_eq_v=False,
                ffn=96, double_wide=False, shared=4, ple=16, window=8, moe=None, seed=4),
    "31b": dict(hidden=64, layers=[S, S, F, S, S, F], heads=4, kv=2, kv_global=1, k_eq_v=True,
                ffn=128, double_wide=False, shared=0, ple=0, window=16, moe=None, seed=31),
    "26b": dict(hidden=64, layers=[S, S, F, S, S, F], heads=4, kv=2, kv_global=1, k_eq_v=True,
                ffn=48, double_wide=False, shared=0, ple=0, window=16,
                moe=dict(experts=8, top_k=2, ffn=32), seed=26),
    # The quantizer tests' fixture (tests/quantize): ffn_down and attn_output rows of 256/512 take
    # K-quant blocks, the 64-wide rows elsewhere make llama.cpp's fallbacks fire, kv=2 of 8 heads is the
    # GQA of 4 that the IQ4 mixes look at, 8 layers give the _M mixes' layer pattern.
    "quant": dict(hidden=64, layers=[S, S, S, F] * 2, heads=8, kv=2, kv_global=None, k_eq_v=False,
                  ffn=256, double_wide=False, shared=2, ple=16, window=8, moe=None, seed=10),
    # Real shapes for benchmarks, never used by tests: 4.6G weights for E2B (8.7 GiB as F16), 7.5G for
    # E4B (14 GiB), 25G for 26B-A4B (47 GiB). Their weights are generated while being written
    # (LazyTensor), so memory stays small whatever the size.
    "e2b-real": dict(hidden=1536, layers=([S] * 4 + [F]) * 7, heads=8, kv=1, kv_global=None, k_eq_v=False,
                     ffn=6144, double_wide=True, shared=20, ple=256, window=512, moe=None, seed=7),
    "e4b-real": dict(hidden=2560, layers=([S] * 5 + [F]) * 7, heads=8, kv=2, kv_global=None, k_eq_v=False,
                     ffn=10240, double_wide=False, shared=18, ple=256, window=512, moe=None, seed=8),
    "26b-a4b-real": dict(hidden=2816, layers=([S] * 5 + [F]) * 5, heads=16, kv=8, kv_global=2, k_eq_v=True,
                         ffn=2112, double_wide=False, shared=0, ple=0, window=1024,
                         moe=dict(experts=128, top_k=8, ffn=704), seed=27),
    # 26B-A4B's layer shapes (128 experts of 704, top 8) in 4 layers: 4.3 GB as Q8_0, written in minutes, for
    # measuring expert products (the real-shape file is 27 GB).
    "26b-a4b-mid-real": dict(hidden=2816, layers=[S, S, S, F], heads=16, kv=8, kv_global=2, k_eq_v=True,
                             ffn=2112, double_wide=False, shared=0, ple=0, window=1024,
                             moe=dict(experts=128, top_k=8, ffn=704), seed=28),
}
HEAD_DIM, GLOBAL_HEAD_DIM = 32, 64
REAL_HEAD_DIM, REAL_GLOBAL_HEAD_DIM = 256, 512
VOCAB = 262144
CONTEXT = 256
REAL_CONTEXT = 131072  # the published E2B/E4B context: benchmarks at llama-bench's n_ctx 4096 need more than 256
EPS = 1e-6
SOFTCAP = 30.0
ROPE_THETA, ROPE_THETA_SWA, PARTIAL_ROTARY = 1e6, 1e4, 0.25


def bf16_round(a):
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def bf16_bytes(a):
    return (bf16_round(a).view(np.uint32) >> 16).astype(np.uint16).tobytes()


# ------------------------------------------------------------------------------------------ model
class Spec:
    def __init__(self, name, v):
        self.name = name
        self.__dict__.update(v)
        real = name.endswith("-real")
        # Variants may set their own vocabulary, head dims and context (tools/train-tiny does).
        self.vocab = v.get("vocab", VOCAB)
        self.hd_s = v.get("hd_s", REAL_HEAD_DIM if real else HEAD_DIM)
        self.hd_f = v.get("hd_f", REAL_GLOBAL_HEAD_DIM if real else GLOBAL_HEAD_DIM)
        self.context = v.get("context", REAL_CONTEXT if real else CONTEXT)
        self.L = len(self.layers)
        self.first_shared = self.L - self.shared

    def is_full(self, l):
        return self.layers[l] == F

    def hd(self, l):
        return self.hd_f if self.is_full(l) else self.hd_s

    def nkv(self, l):
        return self.kv_global if (self.is_full(l) and self.k_eq_v) else self.kv

    def has_v(self, l):
        return not (self.is_full(l) and self.k_eq_v)

    def ffn_width(self, l):
        return self.ffn * 2 if (self.double_wide and l >= self.first_shared) else self.ffn


def weight_recipe(spec):
    """[(HF name, shape, kind, a, b)] in generation order: kind "normal" draws a * N(0, 1), "affine"
    a + b * N(0, 1), "uniform" U(a, b); every value is then rounded to bfloat16."""
    H, P, L = spec.hidden, spec.ple, spec.L
    r = []

    def lin(name, out, inp, gain=1.0):
        r.append((name, (out, inp), "normal", gain / math.sqrt(inp), None))

    def norm(name, n, spread=0.2):
        r.append((name, n, "affine", 1.0, spread))

    r.append(("embed_tokens.weight", (VOCAB, H), "normal", 0.5, None))
    if P:
        r.append(("embed_tokens_per_layer.weight", (VOCAB, L * P), "normal", 0.5, None))
        lin("per_layer_model_projection.weight", L * P, H)
        norm("per_layer_projection_norm.weight", P)
    for l in range(L):
        p = f"layers.{l}."
        hd, nkv = spec.hd(l), spec.nkv(l)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            norm(p + n + ".weight", H)
        lin(p + "self_attn.q_proj.weight", spec.heads * hd, H)
        # KV-shared layers carry K/V weights in real checkpoints too; the model must ignore them.
        lin(p + "self_attn.k_proj.weight", nkv * hd, H)
        if spec.has_v(l):
            lin(p + "self_attn.v_proj.weight", nkv * hd, H)
        lin(p + "self_attn.o_proj.weight", H, spec.heads * hd)
        # Small q/k norm weights keep attention scores (scale 1) near unit spread: a random model with
        # peaky attention would turn float rounding into visible log-prob changes.
        r.append((p + "self_attn.q_norm.weight", hd, "affine", 0.4, 0.05))
        r.append((p + "self_attn.k_norm.weight", hd, "affine", 0.4, 0.05))
        I = spec.ffn_width(l)
        lin(p + "mlp.gate_proj.weight", I, H)
        lin(p + "mlp.up_proj.weight", I, H)
        lin(p + "mlp.down_proj.weight", H, I)
        r.append((p + "layer_scalar", 1, "uniform", 0.6, 1.2))
        if P:
            lin(p + "per_layer_input_gate.weight", P, H)
            lin(p + "per_layer_projection.weight", H, P)
            norm(p + "post_per_layer_input_norm.weight", H)
        if spec.moe:
            E, Im = spec.moe["experts"], spec.moe["ffn"]
            lin(p + "router.proj.weight", E, H, 2.0)
            norm(p + "router.scale", H)
            r.append((p + "router.per_expert_scale", E, "uniform", 0.5, 1.5))
            r.append((p + "experts.gate_up_proj", (E, 2 * Im, H), "normal", 1.5 / math.sqrt(H), None))
            r.append((p + "experts.down_proj", (E, H, Im), "normal", 1.0 / math.sqrt(Im), None))
            for n in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                      "post_feedforward_layernorm_2"):
                norm(p + n + ".weight", H)
    norm("norm.weight", H)
    return r


def draw(rng, shape, kind, a, b):
    """float32 values of one recipe entry, before bfloat16 rounding."""
    if kind == "normal":
        return rng.standard_normal(shape, dtype=np.float32) * a
    if kind == "affine":
        return a + b * rng.standard_normal(shape, dtype=np.float32)
    return rng.uniform(a, b, size=shape).astype(np.float32)


class LazyTensor:
    """A weight of a "-real" variant, generated on demand in row chunks (never whole, unless asked for
    with np.asarray) from its own generator, seeded by the variant seed and the tensor name."""
    CHUNK = 1 << 22  # elements per chunk (16 MiB of float32)

    def __init__(self, seed, name, shape, kind, a, b):
        self.seed, self.name, self.kind, self.a, self.b = seed, name, kind, a, b
        self.shape = tuple(shape) if isinstance(shape, tuple) else (shape,)
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.dtype = np.dtype(np.float32)

    def chunks(self):
        """bfloat16-exact float32 arrays, consecutive slices along axis 0."""
        key = int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:8], "little")
        rng = np.random.default_rng([self.seed, key])
        rows, inner = self.shape[0], self.shape[1:]
        step = max(1, self.CHUNK // max(1, math.prod(inner)))
        for r in range(0, rows, step):
            yield bf16_round(draw(rng, (min(step, rows - r),) + inner, self.kind, self.a, self.b))

    def __array__(self, dtype=None):
        out, r = np.empty(self.shape, dtype=np.float32), 0
        for c in self.chunks():
            out[r: r + c.shape[0]] = c
            r += c.shape[0]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, idx):
        return np.asarray(self)[idx]

    def astype(self, dtype):
        return np.asarray(self).astype(dtype)


def make_weights(spec):
    """HF-named (prefix-free) float32 arrays holding bfloat16-exact values. For "-real" variants the
    values are LazyTensors (same distributions, another random stream) so that nothing big is built."""
    recipe = weight_recipe(spec)
    if spec.name.endswith("-real"):
        return {name: LazyTensor(spec.seed, name, *rest) for name, *rest in recipe}
    rng = np.random.default_rng(spec.seed)
    return {name: bf16_round(draw(rng, shape, kind, a, b)) for name, shape, kind, a, b in recipe}


def hf_config(spec):
    text = {
        "model_type": "gemma4_text",
        "vocab_size": spec.vocab, "hidden_size": spec.hidden, "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.L, "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv, "head_dim": spec.hd_s, "global_head_dim": spec.hd_f,
        "num_global_key_value_heads": spec.kv_global, "attention_k_eq_v": spec.k_eq_v,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": spec.context,
        "rms_norm_eps": EPS, "sliding_window": spec.window, "layer_types": spec.layers,
        "final_logit_softcapping": SOFTCAP, "tie_word_embeddings": True,
        "hidden_size_per_layer_input": spec.ple, "vocab_size_per_layer_input": spec.vocab,
        "num_kv_shared_layers": spec.shared, "use_double_wide_mlp": spec.double_wide,
        "enable_moe_block": bool(spec.moe),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": ROPE_THETA_SWA},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": PARTIAL_ROTARY,
                               "rope_theta": ROPE_THETA}},
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    if spec.moe:
        text.update(num_experts=spec.moe["experts"], top_k_experts=spec.moe["top_k"],
                    moe_intermediate_size=spec.moe["ffn"])
    # transformers may omit default-valued keys: drop two to exercise the loader's defaults.
    for k in ("attention_bias", "hidden_activation"):
        text.pop(k, None)
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
            "tie_word_embeddings": True, "dtype": "bfloat16", "text_config": text,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16},
            "eos_token_id": [1, 106], "image_token_id": 258880}


# ------------------------------------------------------------------------------------------- GGUF
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = range(10)
G_F32, G_F16, G_Q8_0 = 0, 1, 8


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    scalar = {T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "<?"}
    if vtype == T_STR:
        return out + gguf_str(value)
    if vtype == T_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        return out + b"".join(struct.pack(scalar[etype], x) for x in items)
    return out + struct.pack(scalar[vtype], value)


def read_tokenizer_kvs(path):
    """Raw KV records of the tokenizer.* keys of a GGUF file, in file order."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    off = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t, o):
        if t == T_STR:
            (n,) = struct.unpack_from("<Q", data, o)
            return o + 8 + n
        if t == T_ARR:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            if et in sizes:
                return o + sizes[et] * n
            for _ in range(n):
                o = skip(et, o)
            return o
        return o + sizes[t]

    records = []
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", data, off)
        key = data[off + 8: off + 8 + klen].decode()
        off += 8 + klen
        (t,) = struct.unpack_from("<I", data, off)
        off = skip(t, off + 4)
        if key.startswith("tokenizer."):
            records.append(data[start:off])
    return records


def q8_0(a):
    """llama.cpp's reference Q8_0 quantizer (quantize_row_q8_0_ref)."""
    rows = a.reshape(-1, 32)
    amax = np.abs(rows).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.trunc(rows * inv[:, None] + np.copysign(0.5, rows * inv[:, None])).astype(np.int8)
    blocks = np.zeros((rows.shape[0], 34), dtype=np.uint8)
    blocks[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = q.view(np.uint8)
    return blocks.tobytes()


def gguf_tensor_plan(spec, w):
    """(gguf name, HF array, quantizable) in converter order."""
    plan = [("token_embd.weight", w["embed_tokens.weight"], True)]
    n_rot = int(spec.hd_f * PARTIAL_ROTARY) // 2
    rope_freqs = np.array([1.0] * n_rot + [1e30] * (spec.hd_f // 2 - n_rot), dtype=np.float32)
    plan.append(("rope_freqs.weight", rope_freqs, False))
    if spec.ple:
        plan += [("per_layer_token_embd.weight", w["embed_tokens_per_layer.weight"], True),
                 ("per_layer_model_proj.weight", w["per_layer_model_projection.weight"], False),
                 ("per_layer_proj_norm.weight", w["per_layer_projection_norm.weight"], False)]
    names = [
        ("attn_norm.weight", "input_layernorm.weight"), ("attn_q.weight", "self_attn.q_proj.weight"),
        ("attn_k.weight", "self_attn.k_proj.weight"), ("attn_v.weight", "self_attn.v_proj.weight"),
        ("attn_output.weight", "self_attn.o_proj.weight"), ("attn_q_norm.weight", "self_attn.q_norm.weight"),
        ("attn_k_norm.weight", "self_attn.k_norm.weight"),
        ("post_attention_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_norm.weight", "pre_feedforward_layernorm.weight"), ("ffn_gate.weight", "mlp.gate_proj.weight"),
        ("ffn_up.weight", "mlp.up_proj.weight"), ("ffn_down.weight", "mlp.down_proj.weight"),
        ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
        ("layer_output_scale.weight", "layer_scalar"),
        ("inp_gate.weight", "per_layer_input_gate.weight"), ("proj.weight", "per_layer_projection.weight"),
        ("post_norm.weight", "post_per_layer_input_norm.weight"),
        ("ffn_gate_inp.weight", "router.proj.weight"), ("ffn_gate_inp.scale", "router.scale"),
        ("ffn_gate_up_exps.weight", "experts.gate_up_proj"), ("ffn_down_exps.weight", "experts.down_proj"),
        ("ffn_down_exps.scale", "router.per_expert_scale"),
        ("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"),
        ("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"),
        ("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"),
    ]
    for l in range(spec.L):
        for g, h in names:
            a = w.get(f"layers.{l}.{h}")
            if a is None:
                continue
            quantizable = a.ndim >= 2 and g.endswith(".weight") and g != "ffn_gate_inp.weight"
            plan.append((f"blk.{l}.{g}", a, quantizable))
    plan.append(("output_norm.weight", w["norm.weight"], False))
    return plan


def write_gguf(path, spec, w, wtype, vocab_path, tensors=None, tokenizer_kvs=None, name=None):
    """tokenizer_kvs: raw tokenizer.* records; by default those of the GGUF at vocab_path."""
    A = "gemma4."
    L = spec.L
    kvs = [gguf_kv("general.architecture", T_STR, "gemma4"), gguf_kv("general.type", T_STR, "model"),
           gguf_kv("general.name", T_STR, name or f"specula-fixture-{spec.name}"),
           gguf_kv(A + "block_count", T_U32, L), gguf_kv(A + "context_length", T_U32, spec.context),
           gguf_kv(A + "embedding_length", T_U32, spec.hidden)]
    if spec.double_wide:
        kvs.append(gguf_kv(A + "feed_forward_length", T_ARR, (T_I32, [spec.ffn_width(l) for l in range(L)])))
    else:
        kvs.append(gguf_kv(A + "feed_forward_length", T_U32, spec.ffn))
    kvs.append(gguf_kv(A + "attention.head_count", T_U32, spec.heads))
    if spec.kv_global is not None and spec.k_eq_v:
        kvs.append(gguf_kv(A + "attention.head_count_kv", T_ARR, (T_I32, [spec.nkv(l) for l in range(L)])))
    else:
        kvs.append(gguf_kv(A + "attention.head_count_kv", T_U32, spec.kv))
    kvs += [gguf_kv(A + "rope.freq_base", T_F32, ROPE_THETA), gguf_kv(A + "rope.freq_base_swa", T_F32, ROPE_THETA_SWA),
            gguf_kv(A + "attention.layer_norm_rms_epsilon", T_F32, EPS)]
    # Key order as llama.cpp's converter writes it (a real 26B-A4B file agrees).
    if spec.moe:
        kvs += [gguf_kv(A + "expert_count", T_U32, spec.moe["experts"]),
                gguf_kv(A + "expert_used_count", T_U32, spec.moe["top_k"])]
    kvs += [gguf_kv(A + "attention.key_length", T_U32, spec.hd_f), gguf_kv(A + "attention.value_length", T_U32, spec.hd_f),
            gguf_kv("general.file_type", T_U32, {G_F32: 0, G_F16: 1, G_Q8_0: 7}[wtype]),
            gguf_kv(A + "final_logit_softcapping", T_F32, SOFTCAP),
            gguf_kv(A + "attention.sliding_window", T_U32, spec.window),
            gguf_kv(A + "attention.shared_kv_layers", T_U32, spec.shared),
            gguf_kv(A + "embedding_length_per_layer_input", T_U32, spec.ple),
            gguf_kv(A + "attention.sliding_window_pattern", T_ARR, (T_BOOL, [t == S for t in spec.layers])),
            gguf_kv(A + "attention.key_length_swa", T_U32, spec.hd_s),
            gguf_kv(A + "attention.value_length_swa", T_U32, spec.hd_s)]
    if spec.moe:
        kvs.append(gguf_kv(A + "expert_feed_forward_length", T_U32, spec.moe["ffn"]))
    kvs += [gguf_kv(A + "rope.dimension_count", T_U32, spec.hd_f),
            gguf_kv(A + "rope.dimension_count_swa", T_U32, spec.hd_s)]
    kvs.append(gguf_kv("general.quantization_version", T_U32, 2))
    kvs += tokenizer_kvs if tokenizer_kvs is not None else read_tokenizer_kvs(vocab_path)
    write_tensors(path, kvs, tensors if tensors is not None else gguf_tensor_plan(spec, w), wtype)


def stored_type(a, quantizable, wtype):
    """The type write_tensors gives a tensor: wtype if quantizable (F16 where Q8_0 rows are not whole
    blocks), else F32."""
    t = wtype if quantizable else G_F32
    return G_F16 if t == G_Q8_0 and a.shape[-1] % 32 else t


def write_tensors(path, kvs, tensors, wtype):
    """A GGUF file of raw KV records and (name, array, quantizable) tensors, typed by stored_type."""
    infos, items, offset = [], [], 0
    for name, a, quantizable in tensors:
        t = stored_type(a, quantizable, wtype)
        n = math.prod(a.shape)
        nbytes = {G_F32: 4 * n, G_F16: 2 * n, G_Q8_0: n // 32 * 34}[t]
        ne = list(reversed(a.shape))
        infos.append(gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
                     + struct.pack("<IQ", t, offset))
        pad = (-nbytes) % 32
        items.append((name, a, t, nbytes, pad))
        offset += nbytes + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * ((-len(head)) % 32)
    # The file is sized up front but sparse: without this check a full disk shows up mid-write.
    need_space(path, len(head) + offset)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + offset)
    # Each tensor is encoded and written at its offset, piece by piece (a LazyTensor yields row chunks,
    # an array is one piece). The real-shape variants' tensors are written by a process per core: each is
    # drawn from its own generator, so the file is the same bytes whatever the order.
    jobs, at = [], len(head)
    for name, a, t, nbytes, pad in items:
        jobs.append((tmp, at, name, a, t, nbytes))
        at += nbytes + pad
    workers = min(os.cpu_count() or 1, len(jobs))
    try:
        if workers > 1 and any(isinstance(a, LazyTensor) for _, _, _, a, _, _ in jobs):
            import multiprocessing
            # Largest first, so that no big tensor starts last.
            jobs.sort(key=lambda j: -j[5])
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                for error in pool.imap_unordered(_write_tensor, jobs):
                    if error:
                        sys.exit(error)
        else:
            for job in jobs:
                error = _write_tensor(job)
                if error:
                    sys.exit(error)
    except BaseException:
        os.remove(tmp)  # a half-written file must not be left behind the size of a model
        raise
    os.replace(tmp, path)


def need_space(path, nbytes):
    """Exits naming the file and the space it needs when its folder's disk has less free."""
    folder = os.path.dirname(os.path.abspath(path))
    free = shutil.disk_usage(folder).free
    if nbytes > free:
        sys.exit(f"{path}: needs {nbytes / 2**20:.0f} MiB, but only {free / 2**20:.0f} MiB are free on its disk; "
                 "free some space (or generate the fixture on another disk) and run again")


def _write_tensor(job):
    """Encodes one tensor into the file at its offset; returns an error message or None."""
    path, at, name, a, t, nbytes = job
    done = 0
    with open(path, "r+b") as fh:
        fh.seek(at)
        for c in a.chunks() if isinstance(a, LazyTensor) else (a,):
            if t == G_F32:
                blob = np.ascontiguousarray(c, dtype=np.float32).tobytes()
            elif t == G_F16:
                blob = c.astype(np.float16).tobytes()
            else:
                blob = q8_0(np.ascontiguousarray(c, dtype=np.float32))
            fh.write(blob)
            done += len(blob)
    return None if done == nbytes else f"{name}: wrote {done} bytes, expected {nbytes}"


# ------------------------------------------------------------------------------------ safetensors
def write_safetensors(path, tensors, metadata, pad_header=True):
    """tensors: list of (name, dtype string, bytes, shape)."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, blob, shape in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad_header:
        h += b" " * ((-len(h)) % 8)
    need_space(path, 8 + len(h) + offset)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h)
        for _, _, blob, _ in tensors:
            fh.write(blob)
    os.replace(tmp, path)


def read_tokenizer_values(path):
    """The tokenizer.* keys of a GGUF file as Python values (strings, numbers, lists)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def value(t, o):
        if t == T_STR:
            (n,) = struct.unpack_from("<Q", data, o)
            return data[o + 8: o + 8 + n].decode("utf-8"), o + 8 + n
        if t == T_ARR:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            out = []
            for _ in range(n):
                v, o = value(et, o)
                out.append(v)
            return out, o
        return struct.unpack_from(fmt[t], data, o)[0], o + struct.calcsize(fmt[t])

    off, out = 24, {}
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", data, off)
        key = data[off + 8: off + 8 + klen].decode()
        (t,) = struct.unpack_from("<I", data, off + 8 + klen)
        v, off = value(t, off + 12 + klen)
        if key.startswith("tokenizer."):
            out[key] = v
    return out


def write_tokenizer_files(outdir, vocab_path):
    """tokenizer.json and tokenizer_config.json holding the vocab GGUF's tokenizer: the inverse of
    llama.cpp's converter (CONTROL and USER_DEFINED tokens are special added tokens, merges are pairs),
    so converting them back must give the GGUF's tokenizer keys."""
    v = read_tokenizer_values(vocab_path)
    tokens, types = v["tokenizer.ggml.tokens"], v["tokenizer.ggml.token_type"]
    if len(set(tokens)) != len(tokens):
        sys.exit(f"{vocab_path}: duplicate tokens cannot be written as a tokenizer.json vocab")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (t, k) in enumerate(zip(tokens, types)) if k in (3, 4)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
          "pre_tokenizer": None, "post_processor": None,
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(tokens)},
                    "merges": [m.split(" ", 1) for m in v["tokenizer.ggml.merges"]]}}
    with open(os.path.join(outdir, "tokenizer.json"), "w") as fh:
        json.dump(tj, fh, ensure_ascii=False)
    named = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
             "pad_token": "padding_token_id", "mask_token": "mask_token_id"}
    cfg = {k: tokens[v["tokenizer.ggml." + key]] for k, key in named.items() if "tokenizer.ggml." + key in v}
    cfg.update(chat_template=v["tokenizer.chat_template"], tokenizer_class="GemmaTokenizer")
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1, ensure_ascii=False)


def write_hf(outdir, spec, w, decoys=True, config=None, generation=None, shards=1):
    """config / generation: config.json and generation_config.json instead of the fixture's; shards > 1:
    model-0000i-of-0000N.safetensors and model.safetensors.index.json."""
    os.makedirs(outdir, exist_ok=True)
    tensors = [(f"model.language_model.{k}", "BF16", bf16_bytes(a), a.shape) for k, a in sorted(w.items())]
    if decoys:  # vision-tower decoys a text loader must skip
        decoy = np.ones((4, 4), dtype=np.float32)
        tensors.append(("model.vision_tower.encoder.layers.0.mlp.fc1.weight", "BF16", bf16_bytes(decoy), decoy.shape))
    if shards == 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, {"format": "pt"})
    else:
        per = -(-len(tensors) // shards)
        weight_map = {}
        for i in range(shards):
            part = tensors[i * per: (i + 1) * per]
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(outdir, name), part, {"format": "pt"})
            weight_map.update({t[0]: name for t in part})
        with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": sum(len(t[2]) for t in tensors)}, "weight_map": weight_map}, fh,
                      indent=2)
    with open(os.path.join(outdir, "config.json"), "w") as fh:
        json.dump(config or hf_config(spec), fh, indent=2)
    with open(os.path.join(outdir, "generation_config.json"), "w") as fh:
        json.dump(generation or {"bos_token_id": 2, "eos_token_id": [1, 106, 50], "pad_token_id": 0}, fh)


# -------------------------------------------------------------------------------------------- MLX
def mlx_quantize(a, bits, gs):
    """MLX affine quantization (mlx/ops.cpp): returns packed u32 words, bf16 scales and biases, and
    the dequantized float32 values computed from the stored (bf16) scale and bias."""
    shp = a.shape
    g = a.reshape(-1, gs).astype(np.float32)
    n = (1 << bits) - 1
    wmax, wmin = g.max(axis=1), g.min(axis=1)
    s = np.maximum((wmax - wmin) / n, 1e-7)
    neg = np.abs(wmin) > np.abs(wmax)
    s = np.where(neg, s, -s)
    edge = np.where(neg, wmin, wmax)
    q0 = np.rint(edge / s)
    nz = q0 != 0
    s = np.where(nz, edge / np.where(nz, q0, 1), s)
    bias = np.where(nz, edge, 0.0).astype(np.float32)
    s, bias = bf16_round(s.astype(np.float32)), bf16_round(bias)
    q = np.clip(np.rint((g - bias[:, None]) / s[:, None]), 0, n).astype(np.uint64)
    deq = (s[:, None] * q.astype(np.float32) + bias[:, None]).astype(np.float32).reshape(shp)
    # Pack each row as a little-endian bit stream (bits divides 32 here).
    per = 32 // bits
    qw = q.reshape(-1, per)
    words = np.zeros(qw.shape[0], dtype=np.uint64)
    for k in range(per):
        words |= qw[:, k] << np.uint64(k * bits)
    packed = words.astype(np.uint32).reshape(*shp[:-1], shp[-1] * bits // 32)
    scales = s.reshape(*shp[:-1], shp[-1] // gs)
    biases = bias.reshape(*shp[:-1], shp[-1] // gs)
    return packed, scales, biases, deq


def write_mlx(outdir, spec, w, bits, gs=32):
    """Returns the dequantized weights (HF names) the MLX file stands for."""
    os.makedirs(outdir, exist_ok=True)
    prefix = "language_model.model."
    quantized = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                 "up_proj.weight", "down_proj.weight", "embed_tokens.weight", "per_layer_input_gate.weight",
                 "per_layer_projection.weight", "per_layer_model_projection.weight",
                 "embed_tokens_per_layer.weight", "router.proj.weight")
    tensors, deq_all, overrides = [], {}, {}
    items = dict(w)
    for l in range(spec.L):  # mlx-vlm splits the fused expert tensor into switch_glu gate/up
        gu = items.pop(f"layers.{l}.experts.gate_up_proj", None)
        if gu is not None:
            Im = gu.shape[1] // 2
            items[f"layers.{l}.experts.switch_glu.gate_proj.weight"] = gu[:, :Im]
            items[f"layers.{l}.experts.switch_glu.up_proj.weight"] = gu[:, Im:]
            items[f"layers.{l}.experts.switch_glu.down_proj.weight"] = items.pop(f"layers.{l}.experts.down_proj")
        # mlx sanitize drops K/V of KV-shared layers.
        if l >= spec.first_shared and spec.shared:
            for k in ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight"):
                items.pop(f"layers.{l}.{k}", None)
    if any(isinstance(a, LazyTensor) for a in items.values()):
        overrides = write_mlx_streamed(os.path.join(outdir, "model.safetensors"), items, bits, gs, prefix, quantized)
    for k, a in sorted(items.items()) if not overrides else ():
        b = 8 if k.endswith("router.proj.weight") else bits
        if k.endswith(quantized) and a.shape[-1] % gs == 0:
            packed, sc, bi, deq = mlx_quantize(a, b, gs)
            base = prefix + k[: -len(".weight")]
            tensors += [(base + ".weight", "U32", packed.tobytes(), packed.shape),
                        (base + ".scales", "BF16", bf16_bytes(sc), sc.shape),
                        (base + ".biases", "BF16", bf16_bytes(bi), bi.shape)]
            if b != bits:
                overrides[base] = {"group_size": gs, "bits": b}
        else:
            deq = a
            tensors.append((prefix + k, "BF16", bf16_bytes(a), a.shape))
        deq_all[k] = deq
    if tensors:
        write_safetensors(os.path.join(outdir, "model.safetensors"), sorted(tensors), {"format": "mlx"},
                          pad_header=False)
    cfg = hf_config(spec)
    cfg.pop("vision_config")
    overrides.pop("_streamed", None)
    q = {"group_size": gs, "bits": bits, "mode": "affine", **overrides}
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    with open(os.path.join(outdir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
    if not tensors:  # streamed: no reference
        return None
    # Back to HF names (re-fuse experts) for the reference GGUF.
    for l in range(spec.L):
        g = deq_all.pop(f"layers.{l}.experts.switch_glu.gate_proj.weight", None)
        if g is not None:
            u = deq_all.pop(f"layers.{l}.experts.switch_glu.up_proj.weight")
            deq_all[f"layers.{l}.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)
            deq_all[f"layers.{l}.experts.down_proj"] = deq_all.pop(f"layers.{l}.experts.switch_glu.down_proj.weight")
    for k, a in w.items():  # the reference keeps the ignored K/V of shared layers as they were
        deq_all.setdefault(k, a)
    return deq_all


def write_mlx_streamed(path, items, bits, gs, prefix, quantized):
    """write_mlx's file for a "-real" variant's LazyTensors, quantized chunk by chunk (rows are
    independent) straight to their places in the file: little memory. Returns the per-tensor overrides
    (never empty: it also says the file was written)."""
    plan, overrides = [], {"_streamed": True}  # (entry name, dtype, shape, row bytes, source key, part)
    for k, a in items.items():
        rows, cols = math.prod(a.shape[:-1]), a.shape[-1]
        b = 8 if k.endswith("router.proj.weight") else bits
        if k.endswith(quantized) and cols % gs == 0:
            base = prefix + k[: -len(".weight")]
            plan += [(base + ".weight", "U32", a.shape[:-1] + (cols * b // 32,), cols * b // 8, k, "q"),
                     (base + ".scales", "BF16", a.shape[:-1] + (cols // gs,), 2 * cols // gs, k, "s"),
                     (base + ".biases", "BF16", a.shape[:-1] + (cols // gs,), 2 * cols // gs, k, "b")]
            if b != bits:
                overrides[base] = {"group_size": gs, "bits": b}
        else:
            plan.append((prefix + k, "BF16", a.shape, 2 * cols, k, "w"))
    plan.sort()
    header, offset, where = {"__metadata__": {"format": "mlx"}}, 0, {}
    for name, dt, shape, row_bytes, k, part in plan:
        size = row_bytes * math.prod(shape[:-1])
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + size]}
        where[(k, part)] = (offset, row_bytes)
        offset += size
    h = json.dumps(header, separators=(",", ":")).encode()
    base_offset = 8 + len(h)
    need_space(path, 8 + len(h) + offset)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h)
        fh.truncate(base_offset + offset)
        for k, a in sorted(items.items()):
            row = 0
            chunks = a.chunks() if isinstance(a, LazyTensor) else [np.asarray(a)]
            for c in chunks:
                n = math.prod(c.shape[:-1])
                if (k, "w") in where:
                    parts = {"w": bf16_bytes(c)}
                else:
                    b = 8 if k.endswith("router.proj.weight") else bits
                    packed, sc, bi, _ = mlx_quantize(c, b, gs)
                    parts = {"q": packed.tobytes(), "s": bf16_bytes(sc), "b": bf16_bytes(bi)}
                for part, blob in parts.items():
                    off, row_bytes = where[(k, part)]
                    fh.seek(base_offset + off + row * row_bytes)
                    fh.write(blob)
                row += n
    os.replace(tmp, path)
    return overrides


# ------------------------------------------------------------------------------------------- main
ALL_FORMATS = ["f32", "f16", "q8_0", "hf", "mlx4", "mlx8", "mlx4-ref", "mlx8-ref", "hf-tok", "hf-sharded", "mlx4-tok"]


def generate(variant, out, formats, vocab):
    spec = Spec(variant, VARIANTS[variant])
    os.makedirs(out, exist_ok=True)
    with open(__file__, "rb") as fh:
        digest = hashlib.sha256(fh.read() + repr((variant, sorted(formats))).encode()).hexdigest()
    stamp = os.path.join(out, ".stamp")
    # Test processes running in parallel ask for the same fixture: one writes, the others wait.
    with open(os.path.join(out, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(stamp) and open(stamp).read() == digest:
            return
        _generate(spec, out, formats, vocab, stamp, digest)


def _generate(spec, out, formats, vocab, stamp, digest):
    w = make_weights(spec)
    gtypes = {"f32": G_F32, "f16": G_F16, "q8_0": G_Q8_0}
    for f in formats:
        if f in gtypes:
            write_gguf(os.path.join(out, f"model-{f}.gguf"), spec, w, gtypes[f], vocab)
        elif f == "hf":
            write_hf(os.path.join(out, "hf"), spec, w)
        elif f in ("hf-tok", "hf-sharded"):
            write_hf(os.path.join(out, f), spec, w, shards=2 if f == "hf-sharded" else 1)
            write_tokenizer_files(os.path.join(out, f), vocab)
        elif f == "mlx4-tok":
            write_mlx(os.path.join(out, f), spec, w, 4)
            write_tokenizer_files(os.path.join(out, f), vocab)
        elif f in ("mlx4", "mlx8"):  # real shapes: groups of 64, as mlx-community's downloads
            write_mlx(os.path.join(out, f), spec, w, int(f[3:]), 64 if spec.name.endswith("-real") else 32)
        elif f in ("mlx4-ref", "mlx8-ref"):  # only for llama.cpp goldens
            import tempfile
            with tempfile.TemporaryDirectory() as d:
                deq = write_mlx(d, spec, w, int(f[3]))
            write_gguf(os.path.join(out, f"{f[:4]}-ref-f32.gguf"), spec, deq, G_F32, vocab)
        else:
            sys.exit(f"unknown format '{f}' (expected one of {', '.join(ALL_FORMATS)})")
    with open(stamp, "w") as fh:
        fh.write(digest)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--out")
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--vocab", default=DEFAULT_VOCAB)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print(" ".join(k for k in VARIANTS if not k.endswith("-real")))
        return
    if not a.variant or not a.out:
        ap.error("--variant and --out are required")
    try:
        generate(a.variant, a.out, [f for f in a.formats.split(",") if f], a.vocab)
    except OSError as e:  # one line a test log keeps whole, not a traceback cut in the middle
        sys.exit(f"gemma4_fixture.py --variant {a.variant}: {e.filename or a.out}: {e.strerror or e}")
    except MemoryError:
        sys.exit(f"gemma4_fixture.py --variant {a.variant}: out of memory while writing {a.out}; "
                 "run it again with fewer tests in parallel")


if __name__ == "__main__":
    main()
