#!/usr/bin/env python3
"""A plain numpy Gemma 4 text forward pass (gemma4-text-spec.md), written separately from the C++ plugin,
for debugging parity on the fixtures of gemma4_fixture.py. No cache: every position is recomputed
from the whole prefix (full causal attention with the sliding-window mask).

usage: gemma4_reference.py --variant e2b --tokens 2,818,5279 [--top 5] [--gelu exact|fp16]
       gemma4_reference.py --variant e2b --golden OUT.json --like LLAMA_GOLDEN.json [--weights f32|mlx4|mlx8]
  The second form writes a golden file in gemma4_goldens.mjs's format for the same sequences.
  --gelu fp16 mimics ggml's CPU GELU (input and output rounded through an fp16 table), which llama.cpp
  uses; exact is transformers' gelu_pytorch_tanh.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma4_fixture as fx  # noqa: E402


def rms(x, w=None, eps=fx.EPS):
    y = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)
    return (y * w if w is not None else y).astype(np.float64)


def gelu(x, mode):
    if mode == "fp16":
        x = x.astype(np.float16).astype(np.float64)
    y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if mode == "fp16":
        y = np.where(x <= -10, 0.0, np.where(x >= 10, x, y.astype(np.float16).astype(np.float64)))
    return y


def rope(x, pos, pairs, theta, divisor):
    # x [T, H, D], NeoX halves; pairs k < `pairs` rotate.
    D = x.shape[-1]
    half = D // 2
    k = np.arange(half)
    inv = np.where(k < pairs, theta ** (-2.0 * k / divisor), 0.0)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def forward(spec, w, ids, gelu_mode="exact"):
    T, H, L, P = len(ids), spec.hidden, spec.L, spec.ple
    pos = np.arange(T, dtype=np.float64)
    h = w["embed_tokens.weight"][ids].astype(np.float64) * math.sqrt(H)
    if P:
        tok = w["embed_tokens_per_layer.weight"][ids].astype(np.float64) * math.sqrt(P)
        ctx = (h @ w["per_layer_model_projection.weight"].T.astype(np.float64)) / math.sqrt(H)
        ctx = rms(ctx.reshape(T, L, P), w["per_layer_projection_norm.weight"]).reshape(T, L * P)
        ple = (ctx + tok) / math.sqrt(2)
    kv = {}
    for l in range(L):
        p = f"layers.{l}."
        full = spec.is_full(l)
        D, nkv = spec.hd(l), spec.nkv(l)
        pairs = int(spec.hd_f * fx.PARTIAL_ROTARY) // 2 if full else D // 2
        theta = fx.ROPE_THETA if full else fx.ROPE_THETA_SWA
        W = lambda n: w[p + n].astype(np.float64)  # noqa: E731
        x = rms(h, W("input_layernorm.weight"))
        q = rms((x @ W("self_attn.q_proj.weight").T).reshape(T, spec.heads, D), W("self_attn.q_norm.weight"))
        q = rope(q, pos, pairs, theta, D)
        if spec.shared and l >= spec.first_shared:
            prod = max(j for j in range(spec.first_shared) if spec.is_full(j) == full)
            K, V = kv[prod]
        else:
            kr = (x @ W("self_attn.k_proj.weight").T).reshape(T, nkv, D)
            vr = (x @ W("self_attn.v_proj.weight").T).reshape(T, nkv, D) if spec.has_v(l) else kr
            K = rope(rms(kr, W("self_attn.k_norm.weight")), pos, pairs, theta, D)
            V = rms(vr)
            kv[l] = (K, V)
        rep = spec.heads // nkv
        Kr, Vr = np.repeat(K, rep, axis=1), np.repeat(V, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, Kr)
        qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
        ok = ki <= qi
        if not full:
            ok &= (qi - ki) < spec.window
        s = np.where(ok[None], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, Vr).reshape(T, spec.heads * D)
        h = h + rms(a @ W("self_attn.o_proj.weight").T, W("post_attention_layernorm.weight"))
        r = h
        xm = rms(h, W("pre_feedforward_layernorm.weight"))
        m = (gelu(xm @ W("mlp.gate_proj.weight").T, gelu_mode) * (xm @ W("mlp.up_proj.weight").T)) @ W("mlp.down_proj.weight").T
        if spec.moe:
            E, k, Im = spec.moe["experts"], spec.moe["top_k"], spec.moe["ffn"]
            m1 = rms(m, W("post_feedforward_layernorm_1.weight"))
            z = rms(r) * W("router.scale") / math.sqrt(H)
            lg = z @ W("router.proj.weight").T
            pr = np.exp(lg - lg.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            xe = rms(r, W("pre_feedforward_layernorm_2.weight"))
            e = np.zeros((T, H))
            for t in range(T):
                idx = np.argsort(-pr[t], kind="stable")[:k]
                wt = pr[t, idx] / pr[t, idx].sum() * W("router.per_expert_scale")[idx]
                for j, ex in enumerate(idx):
                    gu = W("experts.gate_up_proj")[ex] @ xe[t]
                    e[t] += wt[j] * (W("experts.down_proj")[ex] @ (gelu(gu[:Im], gelu_mode) * gu[Im:]))
            m = m1 + rms(e, W("post_feedforward_layernorm_2.weight"))
        h = r + rms(m, W("post_feedforward_layernorm.weight"))
        if P:
            g = gelu(h @ W("per_layer_input_gate.weight").T, gelu_mode) * ple[:, l * P:(l + 1) * P]
            h = h + rms(g @ W("per_layer_projection.weight").T, W("post_per_layer_input_norm.weight"))
        h = h * W("layer_scalar")
    logits = rms(h, w["norm.weight"].astype(np.float64)) @ w["embed_tokens.weight"].T.astype(np.float64)
    logits = fx.SOFTCAP * np.tanh(logits / fx.SOFTCAP)
    m = logits.max(-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--golden")
    ap.add_argument("--like")
    ap.add_argument("--weights", default="f32", choices=["f32", "mlx4", "mlx8"])
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--gelu", default="exact", choices=["exact", "fp16"])
    a = ap.parse_args()
    spec = fx.Spec(a.variant, fx.VARIANTS[a.variant])
    w = fx.make_weights(spec)
    if a.weights != "f32":  # the values the MLX file stands for
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            w = fx.write_mlx(d, spec, w, int(a.weights[3:]))
    if a.golden:
        like = json.load(open(a.like))
        out = {"model": f"{a.variant} ({a.weights} weights)", "top": like["top"], "sequences": {},
               "reference": "numpy float64 (tools/gemma4_reference.py), exact gelu_pytorch_tanh, no cache"}
        for name, seq in like["sequences"].items():
            lp = forward(spec, w, seq["tokens"], a.gelu)
            out["sequences"][name] = {"tokens": seq["tokens"], "positions": [
                {"pos": i, "top": [[int(t), round(float(row[t]), 6)] for t in np.argsort(-row, kind="stable")[: like["top"]]]}
                for i, row in enumerate(lp)]}
        with open(a.golden, "w") as fh:
            fh.write(json.dumps(out) + "\n")
        return
    ids = [int(t) for t in a.tokens.split(",")]
    lp = forward(spec, w, ids, a.gelu)
    for i, row in enumerate(lp):
        top = np.argsort(-row, kind="stable")[: a.top]
        print(json.dumps({"pos": i, "top": [[int(t), round(float(row[t]), 7)] for t in top]}))


if __name__ == "__main__":
    main()
