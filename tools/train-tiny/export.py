"""Export of the trained pair (train.py export): GGUF files (target Q8_0 in llama.cpp's gemma4 layout,
drafter in the seed's gemma4-assistant layout with its centroid head), Hugging Face directories, and
the goldens Specula is tested against: float64 PyTorch runs on exactly the numbers the GGUF files
hold (tests/models/golden/*.json)."""
import copy
import json
import math
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bpe  # noqa: E402
import corpus  # noqa: E402
import gemma4_assistant_fixture as af  # noqa: E402
import gemma4_fixture as g4  # noqa: E402
import gemma4_torch as g  # noqa: E402
import train  # noqa: E402

TEMPLATE = os.path.join(ROOT, "..", "shared", "gemma4-vocab", "google-gemma-4-31B-it.jinja")
TARGET_GGUF, ASSISTANT_GGUF = "specula-tiny-kjv-q8_0.gguf", "specula-tiny-kjv-assistant-q8_0.gguf"
GOLDEN_TOP = 20
# The model's own generation defaults (generation_config.json), which the default pipeline spells out:
# greedy. Sampled speculative steps run on the host and cost twice a greedy one (models/README.md).
GENERATION = {"bos_token_id": 2, "eos_token_id": [1, 106, 50], "pad_token_id": 0, "do_sample": False}


# ------------------------------------------------------------------------------------- weights
def hf_layer_name(name):
    """A layer parameter of gemma4_torch under its Hugging Face name (q_proj.weight ->
    self_attn.q_proj.weight, q_norm -> self_attn.q_norm.weight, input_layernorm -> ....weight)."""
    if "." not in name and name != "layer_scalar":
        name += ".weight"  # norms are bare parameters in gemma4_torch
    if name.startswith(("q_", "k_", "v_", "o_")):
        return "self_attn." + name
    if name.startswith(("gate_", "up_", "down_")):
        return "mlp." + name
    return name


# Top-level parameters whose Hugging Face names differ (the rest keep theirs; None: not a weight).
TARGET_NAMES = {"norm": "norm.weight", "per_layer_projection_norm": "per_layer_projection_norm.weight"}
ASSISTANT_NAMES = {"embed_tokens.weight": "model.embed_tokens.weight", "norm": "model.norm.weight",
                   "centroids": "masked_embedding.centroids.weight", "ordering": None}


def hf_names(module, layers, top):
    """state_dict key -> Hugging Face name: layer parameters under `layers`.N, the rest through `top`."""
    names = {}
    for k in module.state_dict():
        parts = k.split(".")
        names[k] = (f"{layers}.{parts[1]}.{hf_layer_name('.'.join(parts[2:]))}" if parts[0] == "layers"
                    else top.get(k, k))
    return {k: v for k, v in names.items() if v}


def to_hf(module, names):
    return {hf: module.state_dict()[k].detach().float().numpy().copy() for k, hf in names.items()}


def from_hf(module, names, w):
    """Puts HF-named arrays (e.g. the values a GGUF holds) into the module."""
    state = module.state_dict()
    for k, hf in names.items():
        state[k] = torch.from_numpy(np.asarray(w[hf], dtype=np.float32).copy())
    module.load_state_dict(state)


def target_names(model):
    return hf_names(model, "layers", TARGET_NAMES)


def assistant_names(drafter):
    return hf_names(drafter, "model.layers", ASSISTANT_NAMES)


def target_weights(model):
    """HF names (model.language_model.* without the prefix) -> float32 arrays."""
    out = to_hf(model, target_names(model))
    # Real checkpoints carry K/V weights on KV-shared layers too (unused); llama.cpp expects them.
    cfg = model.cfg
    for l in range(cfg.first_shared, cfg.L):
        src = cfg.source_layer(cfg.is_full(l))
        for n in ("k_proj", "v_proj", "k_norm"):
            out[f"layers.{l}.self_attn.{n}.weight"] = out[f"layers.{src}.self_attn.{n}.weight"].copy()
    return out


def q8_0_values(a):
    """The numbers a Q8_0 tensor written by g4.q8_0 holds."""
    blocks = np.frombuffer(g4.q8_0(np.ascontiguousarray(a, dtype=np.float32)), dtype=np.uint8).reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(a.shape)


def stored_values(w, plan, wtype):
    """HF name -> the numbers the GGUF written from `plan` ((name, array, quantizable), arrays of w)
    holds: Q8_0, F16 or F32 as g4.stored_type decides."""
    types = {id(a): g4.stored_type(a, q, wtype) for _, a, q in plan}
    decode = {g4.G_F32: lambda a: np.asarray(a, dtype=np.float32),
              g4.G_F16: lambda a: a.astype(np.float16).astype(np.float32), g4.G_Q8_0: q8_0_values}
    return {k: decode[types[id(a)]](a) for k, a in w.items()}


# ------------------------------------------------------------------------------------ tokenizer
def kv_strings(key, items):
    out = g4.gguf_str(key) + struct.pack("<I", g4.T_ARR) + struct.pack("<IQ", g4.T_STR, len(items))
    return out + b"".join(g4.gguf_str(s) for s in items)


def tokenizer_kvs(tok, template):
    kv = g4.gguf_kv
    scores = [-1000.0 if t != bpe.NORMAL or i < 109 else -float(i) for i, t in enumerate(tok.types)]
    return [kv("tokenizer.ggml.model", g4.T_STR, "gemma4"), kv_strings("tokenizer.ggml.tokens", tok.tokens),
            kv("tokenizer.ggml.scores", g4.T_ARR, (g4.T_F32, scores)),
            kv("tokenizer.ggml.token_type", g4.T_ARR, (g4.T_I32, tok.types)),
            kv_strings("tokenizer.ggml.merges", tok.merges),
            kv("tokenizer.ggml.bos_token_id", g4.T_U32, tok.id["<bos>"]),
            kv("tokenizer.ggml.eos_token_id", g4.T_U32, tok.id["<eos>"]),
            kv("tokenizer.ggml.unknown_token_id", g4.T_U32, tok.id["<unk>"]),
            kv("tokenizer.ggml.padding_token_id", g4.T_U32, tok.id["<pad>"]),
            kv("tokenizer.ggml.mask_token_id", g4.T_U32, tok.id["<mask>"]),
            kv("tokenizer.chat_template", g4.T_STR, template),
            kv("tokenizer.ggml.add_space_prefix", g4.T_BOOL, False),
            kv("tokenizer.ggml.add_bos_token", g4.T_BOOL, True)]


def write_tokenizer_files(outdir, tok, template):
    with open(os.path.join(outdir, "tokenizer.json"), "w") as fh:
        json.dump(bpe.tokenizer_json(tok), fh, ensure_ascii=False)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as fh:
        json.dump(bpe.tokenizer_config(template), fh, indent=1)


# -------------------------------------------------------------------------------------- goldens
def log_softmax64(logits):
    return torch.log_softmax(logits.double(), -1)


def target_golden(model, seqs):
    out = {"model": TARGET_GGUF, "top": GOLDEN_TOP, "sequences": {},
           "reference": "tools/train-tiny (PyTorch, float64) on the values the Q8_0 file holds"}
    with torch.no_grad():
        for name, ids in seqs.items():
            lp = log_softmax64(model(torch.tensor([ids]))[0])
            out["sequences"][name] = {"tokens": ids, "positions": [
                {"pos": i, "top": [[int(t), round(float(row[t]), 7)] for t in torch.argsort(-row, stable=True)[:GOLDEN_TOP]]}
                for i, row in enumerate(lp)]}
    return out


def greedy(model, ids, n, stop):
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            t = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(t)
            if t in stop:
                break
    return ids


def draft_run(model, drafter, prompt, head, steps=4):
    """K greedy draft steps after the prompt (query position p), in the golden format of
    tests/gemma4_assistant (tools/gemma4_assistant_reference.py)."""
    with torch.no_grad():
        logits, hn, src = model(torch.tensor([prompt]), with_states=True)
        p = len(prompt)
        x = int(logits[0, -1].argmax())
        h = hn[:, -1:]
        qpos = torch.tensor([p])
        masks = drafter.masks(qpos, p)
        scale = math.sqrt(model.cfg.hidden)
        C, K = drafter.cfg.centroids, drafter.cfg.top_k
        out = []
        for _ in range(steps):
            emb = model.embed_tokens(torch.tensor([[x]])) * scale
            n, dense, h_next = drafter.step(emb, h, qpos, src, masks)
            n, dense = n[0, 0], dense[0, 0]
            if head == "dense":
                ids, lg = torch.arange(dense.shape[0]), dense
            else:
                top = torch.argsort(-drafter.centroid_logits(n), stable=True)[:K]
                ids = drafter.ordering.reshape(C, -1)[top].reshape(-1)
                lg = drafter.embed_tokens.weight[ids] @ n
            order = torch.argsort(-lg, stable=True)
            best = int(ids[order[0]])
            hv = h_next[0, 0]
            out.append({"x": x, "token": best, "margin": float(lg[order[0]] - lg[order[1]]),
                        "top": [[int(ids[i]), round(float(lg[i]), 7)] for i in order[:GOLDEN_TOP]],
                        "min_selected": round(float(lg.min()), 7),
                        "h_next": {"first": [round(float(v), 7) for v in hv[:8]], "sum": float(hv.sum()),
                                   "norm": float(hv.norm())}})
            x, h = best, h_next
    return out


# --------------------------------------------------------------------------------------- export
def export(out):
    tok = bpe.load(os.path.join(out, "tokenizer-train.json"))
    template = open(TEMPLATE).read()
    tstate = torch.load(os.path.join(out, "target.pt"))
    astate = torch.load(os.path.join(out, "assistant.pt"))
    target = train.load_target(out)
    tcfg = target.cfg
    drafter = g.Assistant(train.assistant_config(), tcfg)
    drafter.load_state_dict(astate["model"])
    drafter.eval()

    spec = g4.Spec("tiny", dict(hidden=tcfg.hidden, layers=tcfg.layers, heads=tcfg.heads, kv=tcfg.kv, kv_global=None,
                                k_eq_v=False, ffn=tcfg.ffn, double_wide=tcfg.double_wide, shared=tcfg.shared,
                                ple=tcfg.ple, window=tcfg.window, moe=None, seed=0, vocab=tcfg.vocab,
                                hd_s=tcfg.hd_s, hd_f=tcfg.hd_f, context=tcfg.context))
    kvs = tokenizer_kvs(tok, template)
    tw = target_weights(target)
    g4.write_gguf(os.path.join(out, TARGET_GGUF), spec, tw, g4.G_Q8_0, None, tokenizer_kvs=kvs,
                  name="Specula tiny KJV (Gemma 4 architecture)")
    tw_stored = stored_values(tw, g4.gguf_tensor_plan(spec, tw), g4.G_Q8_0)

    dcfg = drafter.cfg
    dspec = af.Spec(dict(name="tiny", hidden=dcfg.hidden, backbone=dcfg.backbone, layers=dcfg.layers,
                         heads=dcfg.heads, kv=tcfg.kv, hd_s=tcfg.hd_s, hd_f=tcfg.hd_f, ffn=dcfg.ffn,
                         window=tcfg.window, context=tcfg.context, centroids=dcfg.centroids, top_k=dcfg.top_k,
                         seed=0, vocab=tcfg.vocab))
    dw, ordering = to_hf(drafter, assistant_names(drafter)), drafter.ordering.numpy().astype(np.int64)
    af.write_gguf(os.path.join(out, ASSISTANT_GGUF), dspec, dw, None, ordering, seed=True, tokenizer_kvs=kvs,
                  name="Specula tiny KJV assistant (gemma4-assistant)", wtype=g4.G_Q8_0)
    dplan = [(n, a, af.quantizable(n, a)) for n, a in af.gguf_tensor_plan(dspec, dw, ordering, seed=True)]
    dw_stored = stored_values(dw, dplan, g4.G_Q8_0)

    # Hugging Face directories (BF16, as published checkpoints are).
    hf = os.path.join(out, "hf")
    cfg = g4.hf_config(spec)
    for k in ("vision_config", "image_token_id"):  # text only
        cfg.pop(k)
    g4.write_hf(hf, spec, tw, decoys=False, config=cfg, generation=GENERATION)
    write_tokenizer_files(hf, tok, template)
    ahf = os.path.join(out, "assistant-hf")
    af.write_hf(ahf, dspec, dw, ordering, generation=GENERATION)
    write_tokenizer_files(ahf, tok, template)

    # Goldens on the stored numbers, in float64.
    ref_t, ref_d = copy.deepcopy(target), copy.deepcopy(drafter)
    from_hf(ref_t, target_names(ref_t), tw_stored)
    from_hf(ref_d, assistant_names(ref_d), dw_stored)
    ref_t, ref_d = ref_t.double().eval(), ref_d.double().eval()
    held = corpus.split(corpus.chapters())[1]
    prompt_text = corpus.chat_prompt(held[3][2][5])
    prompt = tok.encode(prompt_text)
    chat = greedy(ref_t, prompt, 90, {1, 106})
    plain = tok.encode("<bos>" + "\n".join(held[10][2][:6]))[:150]
    golden_dir = os.path.join(ROOT, "tests", "models", "golden")
    os.makedirs(golden_dir, exist_ok=True)
    tg = target_golden(ref_t, {"chat": chat, "plain": plain})
    tg["prompt_text"] = prompt_text
    dump(os.path.join(golden_dir, "tiny-kjv-target.json"), tg)
    dg = {"reference": "tools/train-tiny (PyTorch, float64) on the values the GGUF files hold",
          "target": TARGET_GGUF, "drafter": ASSISTANT_GGUF, "prompt": prompt, "position": len(prompt),
          "embedding_scale": math.sqrt(tcfg.hidden), "top": GOLDEN_TOP, "runs": {}}
    for head in ("dense", "centroid"):
        steps = draft_run(ref_t, ref_d, prompt, head)
        dg["runs"][f"{head}_p"] = {"head": head, "query_position": "p", "steps": steps}
    dg["x"] = dg["runs"]["dense_p"]["steps"][0]["x"]
    dg["held_out_prompts"] = corpus.held_out_prompts(held, 8)
    dump(os.path.join(golden_dir, "tiny-kjv-assistant.json"), dg)
    # The tokenizer as trained, on text the test re-encodes with Specula's tokenizer.
    texts = [prompt_text, "<bos>" + "\n".join(held[20][2][:4]), "Hello, world! Ünïcødé 1234 \t tabs  two  spaces\n\n\nend"]
    dump(os.path.join(golden_dir, "tiny-kjv-tokenizer.json"),
         {"cases": [{"text": t, "ids": tok.encode(t)} for t in texts]})

    report = {"target_params": tstate["params"], "target_val_loss": tstate["val_loss"],
              "target_minutes": tstate["seconds"] / 60, "assistant_params": astate["params"],
              "assistant_agreement_by_step": astate["agreement"], "assistant_minutes": astate["seconds"] / 60,
              "target_bytes": os.path.getsize(os.path.join(out, TARGET_GGUF)),
              "assistant_bytes": os.path.getsize(os.path.join(out, ASSISTANT_GGUF)),
              "sample_greedy": tok.decode(chat[len(prompt):])}
    dump(os.path.join(out, "report.json"), report)
    print(json.dumps(report, indent=1))


def dump(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh, separators=(",", ":"))
        fh.write("\n")
