"""Gemma 4 text model and its gemma4-assistant drafter in PyTorch, for training the tiny default pair.

Written from shared/reference/gemma4-text-spec.md and gemma4-assistant-spec.md, equal in arithmetic to
tools/gemma4_reference.py and tools/gemma4_assistant_reference.py (numpy float64, the references the C++
plugins are tested against): embeddings scaled by sqrt(hidden), per-layer embeddings, sliding and full
layers (NeoX RoPE; proportional RoPE with a quarter of the pairs turning on full layers), attention
scale 1 with q/k norms and a weightless v norm, KV sharing on the last layers, double-wide MLP there,
a per-layer scalar on the residual, final softcap, tied head. Parameter names are the Hugging Face ones
(model.language_model.* without the prefix), so export is a rename.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

S, F_ = "sliding_attention", "full_attention"


@dataclass
class TargetConfig:
    vocab: int = 4096
    hidden: int = 256
    layers: list = field(default_factory=lambda: [S, S, S, S, F_] * 2)
    heads: int = 4
    kv: int = 1
    hd_s: int = 64
    hd_f: int = 128
    ffn: int = 512
    double_wide: bool = True
    shared: int = 5
    ple: int = 64
    window: int = 64
    context: int = 1024
    softcap: float = 30.0
    eps: float = 1e-6
    theta: float = 1e6
    theta_swa: float = 1e4
    partial_rotary: float = 0.25

    @property
    def L(self):
        return len(self.layers)

    @property
    def first_shared(self):
        return self.L - self.shared

    def is_full(self, l):
        return self.layers[l] == F_

    def hd(self, l):
        return self.hd_f if self.is_full(l) else self.hd_s

    def ffn_width(self, l):
        return 2 * self.ffn if self.double_wide and l >= self.first_shared else self.ffn

    def source_layer(self, full):
        """The last layer of a type that computes its own K/V: shared layers and the drafter read its cache."""
        return max(j for j in range(self.first_shared) if self.is_full(j) == full)


@dataclass
class AssistantConfig:
    hidden: int = 128
    backbone: int = 256
    layers: list = field(default_factory=lambda: [S, S, S, F_])
    heads: int = 4
    ffn: int = 512
    centroids: int = 64
    top_k: int = 8

    @property
    def L(self):
        return len(self.layers)


def rms(x, w=None, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def gelu(x):
    return F.gelu(x, approximate="tanh")


def rope_tables(cfg, full, positions):
    """cos, sin [T, D/2] for NeoX halves; pairs past the rotated ones keep angle 0."""
    D = cfg.hd_f if full else cfg.hd_s
    half = D // 2
    pairs = int(cfg.hd_f * cfg.partial_rotary) // 2 if full else half
    theta = cfg.theta if full else cfg.theta_swa
    k = torch.arange(half, dtype=torch.float64)
    inv = torch.where(k < pairs, theta ** (-2.0 * k / D), torch.zeros_like(k))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cs):
    """x [B, T, H, D]."""
    c, s = cs
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = c[None, :, None, :], s[None, :, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def attend(q, K, V, mask):
    """q [B, T, H, D], K/V [B, S, Hkv, D], mask [T, S] bool (True = visible); scale 1."""
    rep = q.shape[2] // K.shape[2]
    K = K.repeat_interleave(rep, dim=2)
    V = V.repeat_interleave(rep, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, K)
    s = s.masked_fill(~mask[None, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p)  # a query with no visible key (the drafter at position 0) attends to nothing
    return torch.einsum("bhts,bshd->bthd", p, V)


def linear(out, inp):
    m = nn.Linear(inp, out, bias=False)
    nn.init.normal_(m.weight, std=1.0 / math.sqrt(inp))
    return m


def norm(n):
    return nn.Parameter(torch.ones(n))


class TargetLayer(nn.Module):
    def __init__(self, cfg, l):
        super().__init__()
        H, D, I, P = cfg.hidden, cfg.hd(l), cfg.ffn_width(l), cfg.ple
        self.input_layernorm, self.post_attention_layernorm = norm(H), norm(H)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(H), norm(H)
        self.q_proj, self.o_proj = linear(cfg.heads * D, H), linear(H, cfg.heads * D)
        self.q_norm = norm(D)
        self.own_kv = l < cfg.first_shared
        if self.own_kv:  # shared layers have no K/V weights here (exported as copies for llama.cpp)
            self.k_proj, self.v_proj = linear(cfg.kv * D, H), linear(cfg.kv * D, H)
            self.k_norm = norm(D)
        self.gate_proj, self.up_proj, self.down_proj = linear(I, H), linear(I, H), linear(H, I)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        if P:
            self.per_layer_input_gate, self.per_layer_projection = linear(P, H), linear(H, P)
            self.post_per_layer_input_norm = norm(H)
        self.cfg, self.D = cfg, D

    def forward(self, h, ple, cs, mask, shared_kv):
        cfg, B, T = self.cfg, h.shape[0], h.shape[1]
        x = rms(h, self.input_layernorm, cfg.eps)
        q = rope(rms(self.q_proj(x).view(B, T, cfg.heads, self.D), self.q_norm, cfg.eps), cs)
        if self.own_kv:
            K = rope(rms(self.k_proj(x).view(B, T, cfg.kv, self.D), self.k_norm, cfg.eps), cs)
            V = rms(self.v_proj(x).view(B, T, cfg.kv, self.D), None, cfg.eps)
        else:
            K, V = shared_kv
        a = attend(q, K, V, mask).reshape(B, T, -1)
        h = h + rms(self.o_proj(a), self.post_attention_layernorm, cfg.eps)
        xm = rms(h, self.pre_feedforward_layernorm, cfg.eps)
        h = h + rms(self.down_proj(gelu(self.gate_proj(xm)) * self.up_proj(xm)), self.post_feedforward_layernorm, cfg.eps)
        if ple is not None:
            g = gelu(self.per_layer_input_gate(h)) * ple
            h = h + rms(self.per_layer_projection(g), self.post_per_layer_input_norm, cfg.eps)
        return h * self.layer_scalar, (K, V)


class Target(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, P, L = cfg.hidden, cfg.ple, cfg.L
        self.embed_tokens = nn.Embedding(cfg.vocab, H)
        nn.init.normal_(self.embed_tokens.weight, std=1.0 / math.sqrt(H))
        if P:
            self.embed_tokens_per_layer = nn.Embedding(cfg.vocab, L * P)
            nn.init.normal_(self.embed_tokens_per_layer.weight, std=1.0 / math.sqrt(P))
            self.per_layer_model_projection = linear(L * P, H)
            self.per_layer_projection_norm = norm(P)
        self.layers = nn.ModuleList(TargetLayer(cfg, l) for l in range(L))
        self.norm = norm(H)

    def masks(self, T, device=None):
        i = torch.arange(T, device=device)
        causal = i[None, :] <= i[:, None]
        return causal & ((i[:, None] - i[None, :]) < self.cfg.window), causal

    def forward(self, ids, with_states=False):
        """ids [B, T] -> logits [B, T, V] (softcapped); with_states also returns the final-normed hidden
        [B, T, H] and the drafter's source K/V {"sliding"/"full": (K, V)} [B, T, Hkv, D]."""
        cfg = self.cfg
        B, T = ids.shape
        H, P, L = cfg.hidden, cfg.ple, cfg.L
        h = self.embed_tokens(ids) * math.sqrt(H)
        ple = None
        if P:
            tok = self.embed_tokens_per_layer(ids) * math.sqrt(P)
            ctx = self.per_layer_model_projection(h) / math.sqrt(H)
            ctx = rms(ctx.view(B, T, L, P), self.per_layer_projection_norm, cfg.eps).view(B, T, L * P)
            ple = (ctx + tok) / math.sqrt(2)
        pos = torch.arange(T)
        tables = {False: rope_tables(cfg, False, pos), True: rope_tables(cfg, True, pos)}
        sliding, causal = self.masks(T)
        kv = {}
        for l, layer in enumerate(self.layers):
            full = cfg.is_full(l)
            shared = kv[cfg.source_layer(full)] if l >= cfg.first_shared else None
            h, kv[l] = layer(h, None if ple is None else ple[..., l * P:(l + 1) * P], tables[full],
                             causal if full else sliding, shared)
        hn = rms(h, self.norm, cfg.eps)
        logits = hn @ self.embed_tokens.weight.t()
        logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        if not with_states:
            return logits
        src = {"sliding": kv[cfg.source_layer(False)], "full": kv[cfg.source_layer(True)]}
        return logits, hn, src


class AssistantLayer(nn.Module):
    def __init__(self, cfg, tcfg, full):
        super().__init__()
        H, D = cfg.hidden, tcfg.hd_f if full else tcfg.hd_s
        self.input_layernorm, self.post_attention_layernorm = norm(H), norm(H)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(H), norm(H)
        self.q_proj, self.o_proj = linear(cfg.heads * D, H), linear(H, cfg.heads * D)
        self.q_norm = norm(D)
        self.gate_proj, self.up_proj, self.down_proj = linear(cfg.ffn, H), linear(cfg.ffn, H), linear(H, cfg.ffn)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.heads, self.D, self.eps = cfg.heads, D, tcfg.eps

    def forward(self, r, cs, K, V, mask):
        B, T = r.shape[:2]
        a = rms(r, self.input_layernorm, self.eps)
        q = rope(rms(self.q_proj(a).view(B, T, self.heads, self.D), self.q_norm, self.eps), cs)
        o = attend(q, K, V, mask).reshape(B, T, -1)
        r = r + rms(self.o_proj(o), self.post_attention_layernorm, self.eps)
        t = rms(r, self.pre_feedforward_layernorm, self.eps)
        r = r + rms(self.down_proj(gelu(self.gate_proj(t)) * self.up_proj(t)), self.post_feedforward_layernorm, self.eps)
        return r * self.layer_scalar


class Assistant(nn.Module):
    """Q-only layers over the target's cache. One draft step, for many query rows at once: row t drafts
    with the token x[t], the state h[t] and query position qpos[t], over the target keys mask[t]."""

    def __init__(self, cfg, tcfg):
        super().__init__()
        self.cfg, self.tcfg = cfg, tcfg
        H, Hb = cfg.hidden, cfg.backbone
        self.embed_tokens = nn.Embedding(tcfg.vocab, H)
        nn.init.normal_(self.embed_tokens.weight, std=1.0 / math.sqrt(H))
        self.pre_projection = linear(H, 2 * Hb)
        self.layers = nn.ModuleList(AssistantLayer(cfg, tcfg, t == F_) for t in cfg.layers)
        self.norm = norm(H)
        self.post_projection = linear(Hb, H)
        self.centroids = nn.Parameter(torch.randn(cfg.centroids, H) / math.sqrt(H))
        self.register_buffer("ordering", torch.arange(tcfg.vocab))

    def step(self, x_emb, h, qpos, src, masks):
        """x_emb [B, T, Hb]: the target's scaled embedding of the input token; h [B, T, Hb]: the target's
        final-normed hidden state (first step) or the previous step's projection. Returns the normed
        state n [B, T, H], the dense logits [B, T, V] (no softcap) and the next h [B, T, Hb]."""
        r = self.pre_projection(torch.cat([x_emb, h], dim=-1))
        for l, layer in enumerate(self.layers):
            full = self.cfg.layers[l] == F_
            K, V = src["full" if full else "sliding"]
            r = layer(r, rope_tables(self.tcfg, full, qpos), K, V, masks[full])
        n = rms(r, self.norm, self.tcfg.eps)
        return n, n @ self.embed_tokens.weight.t(), self.post_projection(n)

    def masks(self, qpos, T):
        """Visible target keys for queries at qpos: every committed position < qpos; sliding layers also
        need qpos - key < window."""
        k = torch.arange(T)
        full = k[None, :] < qpos[:, None]
        return {True: full, False: full & ((qpos[:, None] - k[None, :]) < self.tcfg.window)}

    def centroid_logits(self, n):
        return n @ self.centroids.t()
