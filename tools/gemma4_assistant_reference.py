#!/usr/bin/env python3
"""Float64 numpy reference of the Gemma 4 assistant (MTP drafter), written from
shared/reference/gemma4-assistant-spec.md §2-§3, for the fixtures of gemma4_assistant_fixture.py.

It runs the target reference (tools/gemma4_reference.py, the e2b fixture of gemma4_fixture.py) over a
prompt longer than the sliding window, takes the source layers' post-norm/post-RoPE K and post-norm V
(the last non-KV-shared layer of each attention type) and the final-normed hidden state of the last
prompt position, then runs K greedy draft steps with both heads (dense, centroid) and both query
position conventions (p: HF/llama.cpp; p-1: vLLM/sglang).

Visible keys: every committed target position < p; sliding layers additionally need
query_position - key_position < window (so W-1 keys with query position p, W keys with p-1).

usage: gemma4_assistant_reference.py --golden tests/gemma4_assistant/golden/e2b-assistant.json
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gemma4_assistant_fixture as af  # noqa: E402
import gemma4_fixture as g4  # noqa: E402
import gemma4_reference as g4r  # noqa: E402

# 21 prompt tokens: longer than the e2b fixture's window (8), so the sliding window matters.
PROMPT = [2, 818, 5279, 529, 7001, 563, 1401, 236764, 8521, 672, 531, 9405, 4372, 236761, 1018, 2365, 531,
          1464, 8908, 496, 3925]
STEPS = 4
TOP = 20


def target_state(spec, w, ids):
    """Runs gemma4_reference.forward and captures, through its rms/rope helpers, every layer's K and V
    and the final-normed hidden rows. Returns (log-probs, {layer: (K, V)}, normed hidden [T, H])."""
    ropes, vs, normed = [], [], []
    rms0, rope0 = g4r.rms, g4r.rope

    def rms(x, w_=None, eps=g4.EPS):
        y = rms0(x, w_, eps)
        if w_ is None:
            vs.append(y)  # the only weightless norm of a dense (non-MoE) layer is V's
        normed.append(y)
        return y

    def rope(x, pos, pairs, theta, divisor):
        y = rope0(x, pos, pairs, theta, divisor)
        ropes.append(y)
        return y

    g4r.rms, g4r.rope = rms, rope
    try:
        lp = g4r.forward(spec, w, ids)
    finally:
        g4r.rms, g4r.rope = rms0, rope0
    kv, at = {}, 0
    for l in range(spec.L):  # per layer: rope(q), then rope(K) on layers that compute their own K/V
        at += 1
        if not (spec.shared and l >= spec.first_shared):
            kv[l] = (ropes[at], vs[len(kv)])
            at += 1
    assert at == len(ropes) and len(vs) == len(kv), "gemma4_reference.forward changed shape; update the capture"
    hidden = normed[-1]
    # Cross-check the capture: the tied head on the captured rows gives forward()'s log-probs.
    logits = hidden @ w["embed_tokens.weight"].T.astype(np.float64)
    logits = g4.SOFTCAP * np.tanh(logits / g4.SOFTCAP)
    m = logits.max(-1, keepdims=True)
    check = logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))
    assert np.abs(check - lp).max() < 1e-9, "captured hidden state does not reproduce the target's logits"
    return lp, kv, hidden


def rms(x, w=None, eps=g4.EPS):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(q, pos, full, dspec):
    """q [H, D] at one position. NeoX halves; sliding: every pair, theta 1e4, exponent / D; full:
    proportional, only partial_rotary * D / 2 pairs turn, exponent divided by the full head dim."""
    D = q.shape[-1]
    half = D // 2
    i = np.arange(half)
    if full:
        rotated, theta = int(dspec.hd_f * g4.PARTIAL_ROTARY) // 2, g4.ROPE_THETA
    else:
        rotated, theta = half, g4.ROPE_THETA_SWA
    inv = np.where(i < rotated, theta ** (-2.0 * i / D), 0.0)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    a, b = q[:, :half], q[:, half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def draft_step(dspec, dw, ordering, E_tgt, scale, x, h, qpos, kv, head):
    """One step (§2.7). kv: {"sliding": (K, V, key_positions), "full": (...)} with K/V [S, Hkv, D]."""
    W = lambda n: dw[n].astype(np.float64)  # noqa: E731
    e = E_tgt[x].astype(np.float64) * scale
    r = W("pre_projection.weight") @ np.concatenate([e, h])  # embedding first, then hidden
    for l in range(dspec.L):
        p = f"model.layers.{l}."
        full = dspec.layers[l] == af.F
        D = dspec.hd(l)
        a = rms(r, W(p + "input_layernorm.weight"))
        q = rms((W(p + "self_attn.q_proj.weight") @ a).reshape(dspec.heads, D), W(p + "self_attn.q_norm.weight"))
        q = rope(q, qpos, full, dspec)
        K, V, kp = kv["full" if full else "sliding"]
        ok = kp >= 0
        if not full:
            ok &= (qpos - kp) < dspec.window
        K, V = K[ok], V[ok]
        rep = dspec.heads // K.shape[1]
        o = np.zeros((dspec.heads, V.shape[-1]))
        for j in range(dspec.heads):
            s = K[:, j // rep, :] @ q[j]  # scale 1.0
            s = np.exp(s - s.max())
            o[j] = (s / s.sum()) @ V[:, j // rep, :]
        r = r + rms(W(p + "self_attn.o_proj.weight") @ o.reshape(-1), W(p + "post_attention_layernorm.weight"))
        t = rms(r, W(p + "pre_feedforward_layernorm.weight"))
        m = W(p + "mlp.down_proj.weight") @ (gelu_tanh(W(p + "mlp.gate_proj.weight") @ t) * (W(p + "mlp.up_proj.weight") @ t))
        r = r + rms(m, W(p + "post_feedforward_layernorm.weight"))
        r = r * W(p + "layer_scalar")[0]  # the whole residual stream
    n = rms(r, W("model.norm.weight"))
    E = dw["model.embed_tokens.weight"]
    if head == "dense":
        ids = np.arange(E.shape[0])
        logits = E.astype(np.float64) @ n  # no softcap
    else:
        C, K = dspec.centroids, dspec.top_k
        cent = W("masked_embedding.centroids.weight") @ n
        top = np.argsort(-cent, kind="stable")[:K]
        ids = ordering.reshape(C, -1)[top].reshape(-1)
        logits = E[ids].astype(np.float64) @ n
    h_next = W("post_projection.weight") @ n
    return ids, logits, h_next


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True)
    a = ap.parse_args()

    tspec = g4.Spec("e2b", g4.VARIANTS["e2b"])
    tw = g4.make_weights(tspec)
    dspec = af.Spec(af.SMALL)
    dw, ordering = af.make_weights(dspec)
    assert dspec.backbone == tspec.hidden

    lp, kv_layers, hidden = target_state(tspec, tw, PROMPT)
    p = len(PROMPT)  # the target KV holds positions 0..p-1; x is the token at position p
    x0 = int(np.argmax(lp[-1]))
    h0 = hidden[-1]
    src = {}
    for typ, full in (("sliding", False), ("full", True)):
        l = max(j for j in range(tspec.first_shared) if tspec.is_full(j) == full)
        K, V = kv_layers[l]
        src[typ] = (K, V, np.arange(p))
        src[typ + "_layer"] = l
    scale = math.sqrt(tspec.hidden)  # GGUF target: the exact sqrt(hidden), as the target multiplies
    E_tgt = tw["embed_tokens.weight"]

    out = {"reference": "tools/gemma4_assistant_reference.py (numpy float64, from gemma4-assistant-spec.md)",
           "command": "python3 tools/gemma4_assistant_reference.py --golden tests/gemma4_assistant/golden/e2b-assistant.json",
           "target": "e2b fixture (tools/gemma4_fixture.py), model-f32.gguf",
           "drafter": "tools/gemma4_assistant_fixture.py default (e2b-small)",
           "prompt": PROMPT, "position": p, "x": x0, "embedding_scale": scale,
           "source_layers": {"sliding": src["sliding_layer"], "full": src["full_layer"]},
           "top": TOP, "runs": {}}
    for head in ("dense", "centroid"):
        for conv, off in (("p", 0), ("p-1", 1)):
            x, h, steps = x0, h0, []
            for _ in range(STEPS):
                ids, logits, h_next = draft_step(dspec, dw, ordering, E_tgt, scale, x, h, p - off, src, head)
                order = np.argsort(-logits, kind="stable")
                best = int(ids[order[0]])
                steps.append({
                    "x": int(x), "token": best, "margin": float(logits[order[0]] - logits[order[1]]),
                    "top": [[int(ids[i]), round(float(logits[i]), 7)] for i in order[:TOP]],
                    "min_selected": round(float(logits.min()), 7),
                    "h_next": {"first": [round(float(v), 7) for v in h_next[:8]], "sum": float(h_next.sum()),
                               "norm": float(np.linalg.norm(h_next))}})
                x, h = best, h_next
            out["runs"][f"{head}_{conv}"] = {"head": head, "query_position": conv, "steps": steps}
    os.makedirs(os.path.dirname(os.path.abspath(a.golden)), exist_ok=True)
    with open(a.golden, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    for k, r in out["runs"].items():
        print(k, [s["token"] for s in r["steps"]], ["%.3g" % s["margin"] for s in r["steps"]])


if __name__ == "__main__":
    main()
