#!/usr/bin/env python3
"""Trains Specula's embedded default pair: a tiny Gemma 4 target on the King James Version and its
gemma4-assistant drafter, distilled from the target's own hidden states and K/V. See README.md.

usage: train.py all --out DIR                 the whole recipe (corpus, tokenizer, target, assistant, export)
       train.py {prepare,target,assistant,export} --out DIR
Each stage writes its result into DIR and is skipped when that result exists (delete it to redo).
"""
import argparse
import json
import math
import os
import sys
import time


def blas_core():
    """Debian's OpenBLAS 0.3.21 takes recent Xeons for an old core and runs at a third of its speed;
    name the kernel set from the CPU flags (before torch loads OpenBLAS)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return
    if " avx512f" in flags and " avx512vl" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif " avx2" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


blas_core()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import corpus  # noqa: E402
import gemma4_torch as g  # noqa: E402

SEQ = 256          # training sequence length (the sliding window is 64, so it matters)
BATCH = 8
TARGET_STEPS = 600
ASSISTANT_STEPS = 300
DRAFT_DEPTH = 3    # draft steps unrolled in training (acceptance is reported for K = 1..4)
VOCAB = 4096
SEED = 1234


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ prepare
def prepare(out):
    if os.path.exists(os.path.join(out, "train.npy")):
        return
    chs = corpus.chapters()
    train, held = corpus.split(chs)
    docs = corpus.samples(train, 24000, SEED)
    val_docs = corpus.samples(held, 600, SEED + 1)
    t = time.time()
    tok = bpe.train(docs, VOCAB)
    log(f"tokenizer: {len(tok.tokens)} tokens, {len(tok.merges)} merges ({time.time() - t:.0f} s)")
    bpe.save(tok, os.path.join(out, "tokenizer-train.json"))
    for name, d in (("train", docs), ("val", val_docs)):
        ids = np.array([i for doc in d for i in tok.encode(doc)], dtype=np.int16)
        np.save(os.path.join(out, f"{name}.npy"), ids)
        log(f"{name}: {len(d)} documents, {len(ids)} tokens")
    with open(os.path.join(out, "held_out_prompts.json"), "w") as fh:
        json.dump(corpus.held_out_prompts(held, 64), fh, indent=0)


def batches(ids, steps, seed):
    """BATCH random windows of SEQ + 1 tokens per step, from a seeded generator."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - SEQ - 1, size=BATCH)
        yield torch.from_numpy(np.stack([ids[s:s + SEQ + 1] for s in starts]).astype(np.int64))


def lr_at(step, steps, peak, warmup=40):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def optimizer(params, lr):
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def train_loop(name, out, model, params, steps, peak, loss_fn, data_seed, val_fn):
    """Shared loop: AdamW, warmup + cosine, clipping, a checkpoint every 100 steps (resumed if found)."""
    ckpt = os.path.join(out, f"{name}-ckpt.pt")
    opt = optimizer(params, peak)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        log(f"{name}: resuming at step {start}")
    ids = np.load(os.path.join(out, "train.npy"))
    t0, seen = time.time(), 0
    for step, batch in enumerate(batches(ids, steps, data_seed)):
        if step < start:
            continue
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, steps, peak)
        loss, parts = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        seen += batch.numel()
        if step % 25 == 0 or step == steps - 1:
            rate = seen / (time.time() - t0)
            eta = (steps - step - 1) * BATCH * (SEQ + 1) / rate
            log(f"{name} step {step + 1}/{steps} loss {parts} {rate:.0f} tok/s, {eta / 60:.1f} min left")
        if (step + 1) % 100 == 0 and step + 1 < steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
    val = val_fn()
    return val, time.time() - t0


# ------------------------------------------------------------------------------------------- target
def target_config():
    return g.TargetConfig(vocab=VOCAB)


def load_target(out):
    m = g.Target(target_config())
    m.load_state_dict(torch.load(os.path.join(out, "target.pt"))["model"])
    m.eval()
    return m


def val_batches(out, n=16):
    ids = np.load(os.path.join(out, "val.npy")).astype(np.int64)
    rows = [ids[i:i + SEQ + 1] for i in range(0, len(ids) - SEQ - 1, SEQ)][:n]
    return torch.from_numpy(np.stack(rows))


def train_target(out, steps=TARGET_STEPS):
    path = os.path.join(out, "target.pt")
    if os.path.exists(path):
        return
    torch.manual_seed(SEED)
    model = g.Target(target_config())
    n = sum(p.numel() for p in model.parameters())
    log(f"target: {n / 1e6:.2f} M parameters, {steps} steps of {BATCH} x {SEQ} tokens")

    def loss_fn(b):
        logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), b[:, 1:].reshape(-1))
        return loss, f"{loss.item():.3f}"

    def val_fn():
        model.eval()
        with torch.no_grad():
            b = val_batches(out)
            return F.cross_entropy(model(b[:, :-1]).reshape(-1, VOCAB), b[:, 1:].reshape(-1)).item()

    val, secs = train_loop("target", out, model, list(model.parameters()), steps, 3e-3, loss_fn, SEED, val_fn)
    log(f"target: held-out loss {val:.3f} ({secs / 60:.1f} min)")
    torch.save({"model": model.state_dict(), "val_loss": val, "seconds": secs, "params": n}, path)


# ---------------------------------------------------------------------------------------- assistant
def assistant_config():
    return g.AssistantConfig(backbone=target_config().hidden)


def balanced_clusters(E, C, iters=12, seed=SEED):
    """Ordering [C * S] of the vocabulary: C clusters of exactly S = V / C tokens each, by k-means on
    the normalised target embedding rows with a capacity per cluster (greedy by affinity)."""
    V = E.shape[0]
    S = V // C
    X = F.normalize(E.detach().float(), dim=-1)
    gen = torch.Generator().manual_seed(seed)
    cent = X[torch.randperm(V, generator=gen)[:C]].clone()
    for _ in range(iters):
        aff = X @ cent.t()  # [V, C]
        order = torch.argsort(aff.reshape(-1), descending=True)
        assign = torch.full((V,), -1, dtype=torch.long)
        fill = torch.zeros(C, dtype=torch.long)
        for flat in order.tolist():
            v, c = divmod(flat, C)
            if assign[v] < 0 and fill[c] < S:
                assign[v] = c
                fill[c] += 1
        for c in range(C):
            cent[c] = F.normalize(X[assign == c].mean(0), dim=-1)
    return torch.cat([torch.nonzero(assign == c).flatten() for c in range(C)])


def draft_unrolled(drafter, target, b):
    """Teacher-forced draft steps for every position at once. Step k at query position p drafts token
    p + k + 1 from token p + k, over target keys < p; its label is the target's distribution there."""
    ids = b[:, :-1]
    with torch.no_grad():
        tlogits, hn, src = target(ids, with_states=True)
        tlogp = torch.log_softmax(tlogits, -1)
        temb = target.embed_tokens(ids) * math.sqrt(target.cfg.hidden)
    T = ids.shape[1]
    qpos = torch.arange(1, T)  # p = 1..T-1 (position 0 has no committed keys)
    masks = drafter.masks(qpos, T)
    h = hn[:, :-1]  # h_{p-1}
    steps = []
    for k in range(DRAFT_DEPTH):
        rows = T - 1 - k  # queries whose label position p + k < T
        x = temb[:, 1 + k:]
        n, logits, h_next = drafter.step(x, h[:, :rows], qpos[:rows], src,
                                         {True: masks[True][:rows], False: masks[False][:rows]})
        steps.append((n, logits, tlogp[:, 1 + k:]))
        h = h_next
    return steps


def train_assistant(out, steps=ASSISTANT_STEPS):
    path = os.path.join(out, "assistant.pt")
    if os.path.exists(path):
        return
    target = load_target(out)
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(SEED + 1)
    cfg = assistant_config()
    drafter = g.Assistant(cfg, target.cfg)
    drafter.ordering.copy_(balanced_clusters(target.embed_tokens.weight, cfg.centroids))
    member = torch.empty(VOCAB, dtype=torch.long)  # token -> cluster
    member[drafter.ordering] = torch.arange(VOCAB) // (VOCAB // cfg.centroids)
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"assistant: {n_params / 1e6:.2f} M parameters, {steps} steps, {DRAFT_DEPTH} draft steps each")
    weights = [1.0, 0.7, 0.5, 0.35][:DRAFT_DEPTH]

    def losses(b):
        total, parts = 0.0, []
        for w, (n, logits, tlogp) in zip(weights, draft_unrolled(drafter, target, b)):
            kl = -(tlogp.exp() * torch.log_softmax(logits, -1)).sum(-1).mean()  # cross-entropy to the target
            # The centroid head learns which clusters hold the target's mass (on detached states).
            tp = tlogp.exp()
            cluster_p = torch.zeros(*tp.shape[:-1], cfg.centroids).index_add_(-1, member, tp)
            ce_c = -(cluster_p * torch.log_softmax(drafter.centroid_logits(n.detach()), -1)).sum(-1).mean()
            total = total + w * (kl + ce_c)
            parts.append(f"{kl.item():.3f}")
        return total, "/".join(parts)

    def val_fn():
        drafter.eval()
        with torch.no_grad():
            return [((logits.argmax(-1) == tlogp.argmax(-1)).float().mean().item())
                    for _, logits, tlogp in draft_unrolled(drafter, target, val_batches(out))]

    val, secs = train_loop("assistant", out, drafter, [p for p in drafter.parameters() if p.requires_grad],
                           steps, 3e-3, losses, SEED + 2, val_fn)
    log(f"assistant: held-out top-1 agreement with the target by draft step {[round(v, 3) for v in val]} "
        f"({secs / 60:.1f} min)")
    torch.save({"model": drafter.state_dict(), "agreement": val, "seconds": secs, "params": n_params}, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["all", "prepare", "target", "assistant", "export"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--target-steps", type=int, default=TARGET_STEPS, help="for quick trial runs")
    ap.add_argument("--assistant-steps", type=int, default=ASSISTANT_STEPS, help="for quick trial runs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)
    stages = ["prepare", "target", "assistant", "export"] if a.stage == "all" else [a.stage]
    for s in stages:
        if s == "prepare":
            prepare(a.out)
        elif s == "target":
            train_target(a.out, a.target_steps)
        elif s == "assistant":
            train_assistant(a.out, a.assistant_steps)
        else:
            import export
            export.export(a.out)


if __name__ == "__main__":
    main()
