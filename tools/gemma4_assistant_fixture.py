#!/usr/bin/env python3
"""Deterministic random-weight Gemma 4 "assistant" (MTP drafter) checkpoints, in the real layouts.

Writes one drafter in the layouts real downloads use (docs: shared/reference/gemma4-formats-spec.md):
  assistant-f32.gguf   upstream llama.cpp converter layout (§4.1): general.architecture
                       "gemma4-assistant", the gemma4 keys under the prefix "gemma4-assistant."
                       plus embedding_length_out (= backbone hidden) and nextn_predict_layers
                       (= block_count); tensors token_embd, output_norm, rope_freqs,
                       nextn.pre_projection, nextn.post_projection and 11 Q-only tensors per layer.
                       Like the upstream converter it drops masked_embedding.* (llama.cpp's loader
                       rejects non-empty centroid tensors).
  assistant-seed-f32.gguf  the fork converter layout of shared/seeds/gemma4-assistant.md: the same keys
                       but backbone_hidden_size instead of embedding_length_out, the assistant.*
                       centroid keys, tensors assist_pre_proj / assist_post_proj, and the centroid
                       head kept: assist_embed_centroids [C, hidden] and assist_token_ordering (F32
                       holding the integer ordering).
  assistant-hf-tok/    (format hf-tok) the same with tokenizer.json / tokenizer_config.json from the vocab
                       GGUF, for specula convert
  assistant-hf/        Gemma4AssistantForCausalLM checkpoint (§5.5): config.json (model_type
                       gemma4_assistant, backbone_hidden_size, use_ordered_embeddings, num_centroids,
                       centroid_intermediate_top_k, nested text_config) + model.safetensors (BF16;
                       model.embed_tokens/norm/layers.*, pre_projection, post_projection,
                       masked_embedding.centroids.weight and masked_embedding.token_ordering (I64)).
  assistant-mlx4/      the same checkpoint as mlx-lm quantizes it: embed_tokens, the projections and the
                       centroids affine 4-bit (group 32, bf16 scales/biases), "quantization" in config.json.

Default shapes are a small drafter for the "e2b" target fixture of gemma4_fixture.py (hidden 64):
4 layers [S,S,S,F], hidden 32, 2 query heads, 1 KV head, head dims 32 (sliding) / 64 (full) and
window 8, i.e. the target's KV-cache geometry, so the drafter can attend over that target's K/V.
--real writes the real E2B drafter shapes (hidden 256, backbone 1536, 4 heads, 1 KV head, head dims
256/512, FFN 2048, window 512, 2048 centroids / top-k 32; about 325 MB as F32 GGUF, 158 MB as BF16
safetensors). --real e4b writes the E4B drafter's (backbone 2560, 2 KV heads), --real 26b-a4b the
26B-A4B drafter's (hidden 1024, backbone 2816, 16 heads, FFN 8192, window 1024; dense head, so gguf-f32
only, 1.7 GB). --backbone-hidden pairs the drafter with a target of another hidden size. The vocabulary
is always the full 262144-token Gemma 4 vocab, copied from the vocab GGUF (llama.cpp refuses a file
without tokenizer keys).

Every weight is rounded to bfloat16 first, so the F32 GGUF and the BF16 safetensors hold the very same
numbers. Output is bit-for-bit reproducible (seeded numpy Generator); a stamp file lets repeated calls
return at once.

usage: gemma4_assistant_fixture.py --out DIR [--formats gguf-f32,gguf-seed,hf,mlx4] [--backbone-hidden N]
                                   [--real [e2b|e4b|26b-a4b]]
                                   [--vocab GGUF]
"""
import argparse
import fcntl
import hashlib
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma4_fixture as g4  # noqa: E402  (shared GGUF / safetensors / bf16 helpers)

S, F = g4.S, g4.F
ARCH = "gemma4-assistant"
VOCAB = g4.VOCAB

# Small drafter: matches the "e2b" target fixture's attention geometry (kv=1, head dims 32/64,
# window 8); its backbone is that target's hidden size (64).
SMALL = dict(name="e2b-small", hidden=32, backbone=g4.VARIANTS["e2b"]["hidden"], layers=[S, S, S, F],
             heads=2, kv=g4.VARIANTS["e2b"]["kv"], hd_s=g4.HEAD_DIM, hd_f=g4.GLOBAL_HEAD_DIM, ffn=64,
             window=g4.VARIANTS["e2b"]["window"], context=g4.CONTEXT, centroids=2048, top_k=32, seed=102)
# Real google/gemma-4-E2B-it-assistant shapes (config.json as published).
REAL = dict(name="e2b-real", hidden=256, backbone=1536, layers=[S, S, S, F], heads=4, kv=1,
            hd_s=g4.REAL_HEAD_DIM, hd_f=g4.REAL_GLOBAL_HEAD_DIM, ffn=2048, window=512, context=131072,
            centroids=2048, top_k=32, seed=107)
# google/gemma-4-E4B-it-assistant (third-party configs, spec §1.2): the E2B drafter over backbone 2560
# and the E4B target's 2 KV heads.
REAL_E4B = dict(REAL, name="e4b-real", backbone=2560, kv=2, seed=108)
# google/gemma-4-26B-A4B-it-assistant (third-party configs, spec §1.2): hidden 1024, 16 query heads, FFN
# 8192, window 1024, no ordered embeddings: its head is dense, so only the upstream GGUF layout
# (gguf-f32, which drops the centroids) is a faithful file.
# Its full-attention layer reads the target's 2 global KV heads: head_count_kv per layer, [8, 8, 8, 2].
REAL_26B = dict(REAL, name="26b-a4b-real", hidden=1024, backbone=2816, heads=16, kv=8, kv_global=2, ffn=8192,
                window=1024, context=262144, seed=126)
ALL_FORMATS = ["gguf-f32", "gguf-seed", "hf", "hf-tok", "mlx4"]


class Spec:
    def __init__(self, v, backbone=None):
        self.__dict__.update(v)
        self.vocab = v.get("vocab", VOCAB)  # tools/train-tiny sets its own
        self.kv_global = v.get("kv_global")  # KV heads of the full-attention layers, when they differ
        if backbone is not None:
            self.backbone = backbone
        self.L = len(self.layers)
        if self.backbone == self.hidden:
            sys.exit("backbone hidden must differ from the drafter hidden (llama.cpp rejects equal sizes)")
        if self.vocab % self.centroids:
            sys.exit("vocab size must be a multiple of num_centroids")

    def hd(self, l):
        return self.hd_f if self.layers[l] == F else self.hd_s

    def nkv(self, l):
        return self.kv_global if self.kv_global and self.layers[l] == F else self.kv


def make_weights(spec):
    """Drafter weights under their HF names (float32 arrays holding bfloat16-exact values), plus the
    integer token ordering."""
    rng = np.random.default_rng(spec.seed)
    H, Hb = spec.hidden, spec.backbone
    w = {}

    def lin(name, out, inp, gain=1.0):
        w[name] = g4.bf16_round(rng.standard_normal((out, inp), dtype=np.float32) * (gain / math.sqrt(inp)))

    def norm(name, n, spread=0.2):
        w[name] = g4.bf16_round(1.0 + spread * rng.standard_normal(n, dtype=np.float32))

    w["model.embed_tokens.weight"] = g4.bf16_round(rng.standard_normal((VOCAB, H), dtype=np.float32) * 0.5)
    for l in range(spec.L):
        p = f"model.layers.{l}."
        hd = spec.hd(l)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            norm(p + n + ".weight", H)
        # Q-only attention: K/V come from the target's cache, so there is no k/v proj or k norm.
        lin(p + "self_attn.q_proj.weight", spec.heads * hd, H)
        lin(p + "self_attn.o_proj.weight", H, spec.heads * hd)
        w[p + "self_attn.q_norm.weight"] = g4.bf16_round(0.4 + 0.05 * rng.standard_normal(hd, dtype=np.float32))
        lin(p + "mlp.gate_proj.weight", spec.ffn, H)
        lin(p + "mlp.up_proj.weight", spec.ffn, H)
        lin(p + "mlp.down_proj.weight", H, spec.ffn)
        w[p + "layer_scalar"] = g4.bf16_round(rng.uniform(0.6, 1.2, size=1).astype(np.float32))
    norm("model.norm.weight", H)
    lin("pre_projection.weight", H, 2 * Hb)
    lin("post_projection.weight", Hb, H)
    w["masked_embedding.centroids.weight"] = g4.bf16_round(
        rng.standard_normal((spec.centroids, H), dtype=np.float32) * 0.5)
    ordering = rng.permutation(VOCAB).astype(np.int64)
    # Like trained checkpoints, tokens of one cluster share its centroid's direction (row c of the
    # [C, S] ordering lists cluster c's ids), so the dense argmax usually lies in the selected clusters.
    S = VOCAB // spec.centroids
    members = ordering.reshape(spec.centroids, S)
    emb = w["model.embed_tokens.weight"]
    emb[members] = g4.bf16_round(0.8 * w["masked_embedding.centroids.weight"][:, None, :] + 0.6 * emb[members])
    return w, ordering


def hf_config(spec):
    text = {
        "model_type": "gemma4_text",
        "vocab_size": spec.vocab, "hidden_size": spec.hidden, "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.L, "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv, "head_dim": spec.hd_s, "global_head_dim": spec.hd_f,
        "num_global_key_value_heads": spec.kv_global, "attention_k_eq_v": bool(spec.kv_global),
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": spec.context,
        "rms_norm_eps": g4.EPS, "sliding_window": spec.window, "layer_types": spec.layers,
        "final_logit_softcapping": None, "tie_word_embeddings": True,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
        "num_kv_shared_layers": spec.L, "use_double_wide_mlp": False, "enable_moe_block": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": g4.ROPE_THETA_SWA},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": g4.PARTIAL_ROTARY,
                               "rope_theta": g4.ROPE_THETA}},
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    return {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
            "backbone_hidden_size": spec.backbone, "use_ordered_embeddings": True,
            "num_centroids": spec.centroids, "centroid_intermediate_top_k": spec.top_k,
            "tie_word_embeddings": True, "dtype": "bfloat16", "text_config": text}


def write_hf(outdir, spec, w, ordering, generation=None):
    """generation: generation_config.json instead of the fixture's."""
    os.makedirs(outdir, exist_ok=True)
    tensors = [(k, "BF16", g4.bf16_bytes(a), a.shape) for k, a in w.items()]
    tensors.append(("masked_embedding.token_ordering", "I64", ordering.astype("<i8").tobytes(), ordering.shape))
    g4.write_safetensors(os.path.join(outdir, "model.safetensors"), sorted(tensors), {"format": "pt"})
    with open(os.path.join(outdir, "config.json"), "w") as fh:
        json.dump(hf_config(spec), fh, indent=2)
    with open(os.path.join(outdir, "generation_config.json"), "w") as fh:
        json.dump(generation or {"bos_token_id": 2, "eos_token_id": [1, 106, 50], "pad_token_id": 0}, fh)


def write_mlx(outdir, spec, w, ordering, bits=4, gs=32):
    """The HF checkpoint as mlx-lm quantizes it: every Linear / Embedding weight whose rows are whole
    groups (embed_tokens, the projections, the centroids) affine-quantized to `bits` with bf16 scales and
    biases, the rest kept BF16, header metadata {"format": "mlx"}, config.json with the quantization."""
    os.makedirs(outdir, exist_ok=True)
    tensors = []
    for k, a in sorted(w.items()):
        if a.ndim == 2 and k.endswith(".weight") and "norm" not in k and a.shape[-1] % gs == 0:
            packed, sc, bi, _ = g4.mlx_quantize(a, bits, gs)
            base = k[: -len(".weight")]
            tensors += [(base + ".weight", "U32", packed.tobytes(), packed.shape),
                        (base + ".scales", "BF16", g4.bf16_bytes(sc), sc.shape),
                        (base + ".biases", "BF16", g4.bf16_bytes(bi), bi.shape)]
        else:
            tensors.append((k, "BF16", g4.bf16_bytes(a), a.shape))
    tensors.append(("masked_embedding.token_ordering", "I64", ordering.astype("<i8").tobytes(), ordering.shape))
    g4.write_safetensors(os.path.join(outdir, "model.safetensors"), sorted(tensors), {"format": "mlx"},
                         pad_header=False)
    cfg = hf_config(spec)
    cfg["quantization"] = cfg["quantization_config"] = {"group_size": gs, "bits": bits, "mode": "affine"}
    with open(os.path.join(outdir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
    with open(os.path.join(outdir, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 106, 50], "pad_token_id": 0}, fh)


def gguf_tensor_plan(spec, w, ordering=None, seed=False):
    """(gguf name, array) in the upstream converter's order (rope_freqs first, then HF key order).
    seed: the fork layout (assist_* names, centroid head kept)."""
    n_rot = int(spec.hd_f * g4.PARTIAL_ROTARY) // 2
    rope_freqs = np.array([1.0] * n_rot + [1e30] * (spec.hd_f // 2 - n_rot), dtype=np.float32)
    plan = [("rope_freqs.weight", rope_freqs), ("token_embd.weight", w["model.embed_tokens.weight"])]
    names = [("attn_norm.weight", "input_layernorm.weight"), ("attn_q.weight", "self_attn.q_proj.weight"),
             ("attn_q_norm.weight", "self_attn.q_norm.weight"), ("attn_output.weight", "self_attn.o_proj.weight"),
             ("post_attention_norm.weight", "post_attention_layernorm.weight"),
             ("ffn_norm.weight", "pre_feedforward_layernorm.weight"), ("ffn_gate.weight", "mlp.gate_proj.weight"),
             ("ffn_up.weight", "mlp.up_proj.weight"), ("ffn_down.weight", "mlp.down_proj.weight"),
             ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
             ("layer_output_scale.weight", "layer_scalar")]
    for l in range(spec.L):
        plan += [(f"blk.{l}.{g}", w[f"model.layers.{l}.{h}"]) for g, h in names]
    plan.append(("output_norm.weight", w["model.norm.weight"]))
    if seed:
        plan += [("assist_post_proj.weight", w["post_projection.weight"]),
                 ("assist_pre_proj.weight", w["pre_projection.weight"]),
                 ("assist_embed_centroids.weight", w["masked_embedding.centroids.weight"]),
                 # F32 storage of the integer ordering (every value < 2^24 is exact), as the seed says.
                 ("assist_token_ordering.weight", ordering.astype(np.float32))]
    else:
        plan += [("nextn.post_projection.weight", w["post_projection.weight"]),
                 ("nextn.pre_projection.weight", w["pre_projection.weight"])]
    return plan


def write_gguf(path, spec, w, vocab_path, ordering=None, seed=False, tokenizer_kvs=None, name=None, wtype=g4.G_F32):
    """tokenizer_kvs: raw tokenizer.* records; by default those of the GGUF at vocab_path. wtype: the
    matrices' type (F32 as the converter writes; Q8_0 keeps the centroids and vectors F32)."""
    A = ARCH + "."
    kv = g4.gguf_kv
    T = g4
    kvs = [kv("general.architecture", T.T_STR, ARCH), kv("general.type", T.T_STR, "model"),
           kv("general.name", T.T_STR, name or f"specula-fixture-assistant-{spec.name}"),
           kv(A + "block_count", T.T_U32, spec.L), kv(A + "context_length", T.T_U32, spec.context),
           kv(A + "embedding_length", T.T_U32, spec.hidden),
           kv(A + "feed_forward_length", T.T_U32, spec.ffn),
           kv(A + "attention.head_count", T.T_U32, spec.heads),
           kv(A + "attention.head_count_kv", T.T_ARR, (T.T_I32, [spec.nkv(l) for l in range(spec.L)]))
           if spec.kv_global else kv(A + "attention.head_count_kv", T.T_U32, spec.kv),
           kv(A + "rope.freq_base", T.T_F32, g4.ROPE_THETA), kv(A + "rope.freq_base_swa", T.T_F32, g4.ROPE_THETA_SWA),
           kv(A + "attention.layer_norm_rms_epsilon", T.T_F32, g4.EPS),
           kv(A + "attention.key_length", T.T_U32, spec.hd_f), kv(A + "attention.value_length", T.T_U32, spec.hd_f),
           kv("general.file_type", T.T_U32, {g4.G_F32: 0, g4.G_F16: 1, g4.G_Q8_0: 7}[wtype]),
           kv(A + "attention.sliding_window", T.T_U32, spec.window),
           kv(A + "attention.shared_kv_layers", T.T_U32, spec.L),
           kv(A + "embedding_length_per_layer_input", T.T_U32, 0),
           kv(A + "attention.sliding_window_pattern", T.T_ARR, (T.T_BOOL, [t == S for t in spec.layers])),
           kv(A + "attention.key_length_swa", T.T_U32, spec.hd_s),
           kv(A + "attention.value_length_swa", T.T_U32, spec.hd_s),
           kv(A + "rope.dimension_count", T.T_U32, spec.hd_f),
           kv(A + "rope.dimension_count_swa", T.T_U32, spec.hd_s)]
    if seed:
        kvs += [kv(A + "nextn_predict_layers", T.T_U32, spec.L), kv("general.quantization_version", T.T_U32, 2),
                kv(A + "backbone_hidden_size", T.T_U32, spec.backbone),
                kv(A + "assistant.num_centroids", T.T_U32, spec.centroids),
                kv(A + "assistant.centroid_intermediate_top_k", T.T_U32, spec.top_k),
                kv(A + "assistant.use_ordered_embeddings", T.T_BOOL, True)]
    else:  # llama.cpp's Gemma4AssistantModel order
        kvs += [kv(A + "embedding_length_out", T.T_U32, spec.backbone), kv(A + "nextn_predict_layers", T.T_U32, spec.L),
                kv("general.quantization_version", T.T_U32, 2)]
    kvs += tokenizer_kvs if tokenizer_kvs is not None else g4.read_tokenizer_kvs(vocab_path)

    g4.write_tensors(path, kvs, [(n, a, quantizable(n, a)) for n, a in gguf_tensor_plan(spec, w, ordering, seed)], wtype)


def quantizable(name, a):
    """Whether write_gguf stores a tensor in its wtype: the matrices, but not the centroids (kept F32)."""
    return a.ndim >= 2 and name != "assist_embed_centroids.weight"


def generate(spec, out, formats, vocab):
    for f in formats:
        if f not in ALL_FORMATS:
            sys.exit(f"unknown format '{f}' (expected one of {', '.join(ALL_FORMATS)})")
    os.makedirs(out, exist_ok=True)
    with open(__file__, "rb") as fh, open(g4.__file__, "rb") as gh:
        digest = hashlib.sha256(fh.read() + gh.read() + repr((sorted(spec.__dict__.items()),
                                                              sorted(formats))).encode()).hexdigest()
    stamp = os.path.join(out, ".stamp-assistant")
    with open(os.path.join(out, ".lock-assistant"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(stamp) and open(stamp).read() == digest:
            return
        w, ordering = make_weights(spec)
        if "gguf-f32" in formats:
            write_gguf(os.path.join(out, "assistant-f32.gguf"), spec, w, vocab)
        if "gguf-seed" in formats:
            write_gguf(os.path.join(out, "assistant-seed-f32.gguf"), spec, w, vocab, ordering, seed=True)
        if "hf" in formats:
            write_hf(os.path.join(out, "assistant-hf"), spec, w, ordering)
        if "hf-tok" in formats:  # for specula convert: with the vocab GGUF's tokenizer as tokenizer.json
            write_hf(os.path.join(out, "assistant-hf-tok"), spec, w, ordering)
            g4.write_tokenizer_files(os.path.join(out, "assistant-hf-tok"), vocab)
        if "mlx4" in formats:
            write_mlx(os.path.join(out, "assistant-mlx4"), spec, w, ordering)
        with open(stamp, "w") as fh:
            fh.write(digest)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--backbone-hidden", type=int, default=None,
                    help="hidden size of the target the drafter pairs with (default: 64 = the e2b "
                         "target fixture; 1536 with --real)")
    ap.add_argument("--real", nargs="?", const="e2b", choices=["e2b", "e4b", "26b-a4b"],
                    help="real drafter shapes: e2b (the default; hidden 256, backbone 1536), e4b (backbone "
                         "2560, 2 KV heads) or 26b-a4b (hidden 1024, backbone 2816; use gguf-f32)")
    ap.add_argument("--vocab", default=g4.DEFAULT_VOCAB)
    a = ap.parse_args()
    spec = Spec({None: SMALL, "e2b": REAL, "e4b": REAL_E4B, "26b-a4b": REAL_26B}[a.real], a.backbone_hidden)
    try:
        generate(spec, a.out, [f for f in a.formats.split(",") if f], a.vocab)
    except OSError as e:  # one line a test log keeps whole (a full disk, most likely)
        sys.exit(f"gemma4_assistant_fixture.py: {e.filename or a.out}: {e.strerror or e}")


if __name__ == "__main__":
    main()
