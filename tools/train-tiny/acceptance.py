#!/usr/bin/env python3
"""Acceptance and speed-up of the default pair on held-out KJV verses, as the model card reports them:
for each draft length K, `specula run --json --speedup` at temperature 0 on every prompt: one process per
prompt that warms both ways up, then times the generation with the drafter and without it five times
each, alternating (as `make run` does); the rates are those medians, summed over prompts as time per
token.

--cold times one fresh process each way per prompt instead (A B alternating): the first steps of a
process pack the weights, page them in and build every graph shape, and a drafter adds its own, so in
64-token runs the ratio then also measures start-up.

usage: acceptance.py [--specula build/bin/specula] [--pipeline YAML] [--prompts N] [--tokens N] [--threads N]
                     [--k 1,2,3,4,auto] [--cold]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import corpus  # noqa: E402


def run(specula, pipeline, prompt, tokens, threads, extra):
    cmd = [specula, "run", pipeline, "-q", "--json", "--prompt", prompt,
           "--max-tokens", str(tokens), "--temp", "0"] + extra
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specula", default=os.path.join(ROOT, "build", "bin", "specula"))
    ap.add_argument("--pipeline", default=os.path.join(ROOT, "configs", "speculative.yaml"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--k", default="1,2,3,4")
    ap.add_argument("--cold", action="store_true", help="one fresh process each way per prompt, start-up included")
    a = ap.parse_args()
    held = corpus.split(corpus.chapters())[1]
    prompts = corpus.held_out_prompts(held, a.prompts, seed=11)
    print(f"{len(prompts)} held-out verses, {a.tokens} tokens each, greedy, "
          f"{'fresh processes' if a.cold else 'warm (median of 5 runs each way)'}")
    print("K    acceptance  tokens/step  tok/s with  tok/s without  speed-up")
    for k in a.k.split(","):
        drafted = accepted = steps = 0
        t_spec = t_plain = n_spec = n_plain = 0.0
        for p in prompts:
            if a.cold:
                s = run(a.specula, a.pipeline, p, a.tokens, a.threads, ["--draft-max", str(k)])
                b = run(a.specula, a.pipeline, p, a.tokens, a.threads, ["--no-drafter"])
                plain_tokens = b["tokens"]
                st, bt = s["stats"], b["stats"]
                t_spec += st["decode_seconds"]
                t_plain += bt["decode_seconds"]
                n_plain += bt["generated_tokens"] - 1
            else:
                s = run(a.specula, a.pipeline, p, a.tokens, a.threads, ["--draft-max", str(k), "--speedup"])
                plain_tokens = s["baseline"]["tokens"]
                st = s["stats"]
                # Both rates count the tokens after the first (which comes from the prefill).
                made = st["generated_tokens"] - 1
                t_spec += made / s["speedup_runs"]["decode_tokens_per_second"]
                t_plain += made / s["baseline"]["decode_tokens_per_second"]
                n_plain += made
            if s["tokens"] != plain_tokens:
                print(f"  warning: K={k} output differs from plain decoding on {p[:40]!r}")
            drafted += st["drafted_tokens"]
            accepted += st["accepted_tokens"]
            steps += st["speculative_steps"]
            n_spec += st["generated_tokens"] - 1
        rate = accepted / drafted if drafted else 0
        with_, without = n_spec / t_spec, n_plain / t_plain
        print(f"{k:4} {100 * rate:9.1f} %  {(accepted + steps) / max(1, steps):11.2f}  {with_:10.1f}  "
              f"{without:13.1f}  {with_ / without:7.2f}x")


if __name__ == "__main__":
    main()
