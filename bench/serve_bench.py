#!/usr/bin/python3
"""Aggregate decode rate and time to first token of `specula serve` under N concurrent streams.

Starts `specula serve MODEL --parallel MAX(N) --port 0`, then for each concurrency N sends N streamed
/v1/completions requests at once (the same prompt length, exactly --tokens tokens each through min_tokens,
so a random-weight file generates as much as a real one), and reports per N: the aggregate generated
tokens per second (all tokens / first request sent to last token), the mean and worst time to first token,
and the ratio to N = 1 measured in the same run.

    bench/serve_bench.py --model /work/fixtures-real/model-q4_0.gguf --streams 1,8 --threads 2
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT_WORDS = "the quick brown fox jumps over the lazy dog and then it runs far away into the green wood".split()


def stream_request(url, prompt, tokens, out):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    generated = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
            elif first is None and chunk["choices"] and chunk["choices"][0].get("text"):
                first = time.perf_counter()
    out.append({"start": start, "first": first or time.perf_counter(), "end": time.perf_counter(), "tokens": generated})


def run_round(url, streams, prompt_words, tokens):
    results = []
    # Each stream its own prompt (a different first word), so no request reuses another's prefix.
    def prompt(i):
        return " ".join(([str(i)] + PROMPT_WORDS * (prompt_words // len(PROMPT_WORDS) + 1))[:prompt_words])
    threads = [threading.Thread(target=stream_request, args=(url, prompt(i), tokens, results)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != streams:
        sys.exit(f"serve_bench: {streams - len(results)} of {streams} requests failed")
    t0 = min(r["start"] for r in results)
    t1 = max(r["end"] for r in results)
    total = sum(r["tokens"] for r in results)
    ttft = [r["first"] - r["start"] for r in results]
    return {"streams": streams, "tokens": total, "seconds": t1 - t0, "tokens_per_second": total / (t1 - t0),
            "ttft_mean_s": sum(ttft) / len(ttft), "ttft_max_s": max(ttft)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model file or pipeline YAML")
    ap.add_argument("--specula", default="build/bin/specula")
    ap.add_argument("--streams", default="1,8", help="concurrencies to measure, comma-separated (1 first)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens each request generates")
    ap.add_argument("--prompt-words", type=int, default=24, help="about this many words of prompt per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=1024, help="each slot's context length")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per concurrency; the best one is reported")
    ap.add_argument("--extra", default="", help="more arguments for specula serve, e.g. '--drafter FILE'")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    streams = [int(s) for s in a.streams.split(",")]
    cmd = [a.specula, "serve", a.model, "--port", "0", "--parallel", str(max(streams)), "-t", str(a.threads),
           "-c", str(a.context),
           "--queue-limit", str(4 * max(streams))] + a.extra.split()
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        m = re.search(r"(http://\S+)", server.stdout.readline())
        if not m:
            sys.exit(f"serve_bench: {' '.join(cmd)} printed no address")
        url = m.group(1)
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except Exception:
                time.sleep(0.2)
        run_round(url, max(streams), a.prompt_words, 4)  # warm every slot
        rows = []
        for n in streams:
            rows.append(max((run_round(url, n, a.prompt_words, a.tokens) for _ in range(a.rounds)),
                            key=lambda r: r["tokens_per_second"]))
        base = rows[0]["tokens_per_second"]
        for r in rows:
            r["ratio_to_first"] = r["tokens_per_second"] / base
        if a.json:
            print(json.dumps({"model": a.model, "threads": a.threads, "tokens": a.tokens, "rows": rows}, indent=1))
        else:
            print(f"{'streams':>8} {'tok/s':>8} {'ratio':>6} {'TTFT mean':>10} {'TTFT max':>9}")
            for r in rows:
                print(f"{r['streams']:>8} {r['tokens_per_second']:>8.2f} {r['ratio_to_first']:>5.2f}x "
                      f"{1000 * r['ttft_mean_s']:>7.0f} ms {1000 * r['ttft_max_s']:>6.0f} ms")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
