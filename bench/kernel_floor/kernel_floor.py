#!/usr/bin/env python3
"""The dot-product rate each vCPU can reach: the floor under the CPU backend's multi-row tiles.

A verification of 5-9 rows is compute-bound (`specula bench --profile` shows its products far below the
bandwidth), so how flat verification can be is set by how many `vpdpbusd` a second a core retires with
the work a weight format needs around them. This writes small loops in inline assembly (fixed
registers: no spills, no compiler scheduling; data in L1, so no memory stream), compiles them with g++
and runs each pinned on every vCPU:

  dpbusd        12 independent vpdpbusd chains, register operands: the bare instruction rate
  bcast         R chains, the 4 activation bytes broadcast from memory ({1to16}), as the tiles do (below
                ~8 rows the chains' latency, 4 cycles a dot, bounds this loop rather than the dot rate)
  q4k           the packed Q4_K tile's work at R rows: a line load and a mask a line, R broadcast dots a
                line, then per 32-value sub-block and row a scale multiply, an add and a zeroing
  q6k           the packed Q6_K tile's: two line loads, a shift, a mask and a ternary logic op a line (the
                6-bit codes), R dots a line, per 16-value sub-block the scale's extraction and per row its
                multiply, add and zeroing
  scalar        a chain of integer multiply-adds: the clock, to tell a vCPU whose vector units are shared
                with another tenant (SMT sibling) from one running at a lower clock
  +OP           (`--pipes`) the dpbusd loop with one OP beside every 8 dots (vpmulld, vpdpwssd, vfmadd231ps,
                vmulps, vpaddd, vpandd, vcvtdq2ps): an OP that slows it runs on the dot's own pipes, so it costs a
                dot wherever a tile has one (the K-quant tiles' scale multiplies, mins and float epilogue)

Prints, per vCPU, G vpdpbusd a second for each loop (scalar: G iterations a second). The tiles' own rate
comes from `bench_matvec --threads 1` under `taskset -c CPU`; docs/performance.md compares the two.

  python3 bench/kernel_floor/kernel_floor.py [--rows 9] [--seconds 0.5] [--cpus 0,1] [--pipes]

Needs g++ and an AVX-512 VNNI CPU (exits 77 without one).
"""
import argparse
import os
import subprocess
import sys
import tempfile


def dpbusd_loop(rows):
    del rows
    return [f"vpdpbusd %%zmm{20 + c % 4}, %%zmm{24 + c % 4}, %%zmm{c}" for c in range(12) for _ in range(8)], 96


def bcast_loop(rows):
    body = []
    for k in range(8):
        for r in range(rows):
            body.append(f"vpdpbusd {64 * r + 4 * k}(%[x])%{{1to16%}}, %%zmm28, %%zmm{r}")
    return body, 8 * rows


def scale_rows(rows, scale_reg):
    # Per row: the sub-block's dot times its scale, added to the row's sum; the dot starts again from 0.
    body = []
    for r in range(rows):
        body.append(f"vpmulld %%zmm{scale_reg}, %%zmm{r}, %%zmm{r}")
        body.append(f"vpaddd %%zmm{r}, %%zmm{rows + r}, %%zmm{rows + r}")
        body.append(f"vpxord %%zmm{r}, %%zmm{r}, %%zmm{r}")
    return body


def q4k_loop(rows):
    body = []
    for k in range(8):  # the 8 lines of a 32-value sub-block (16 weight rows x 4 values a line)
        body.append(f"vmovdqu64 {64 * k}(%[w]), %%zmm28")
        body.append("vpandd %%zmm29, %%zmm28, %%zmm28")
        for r in range(rows):
            body.append(f"vpdpbusd {64 * r + 4 * k}(%[x])%{{1to16%}}, %%zmm28, %%zmm{r}")
    return body + scale_rows(rows, 30), 8 * rows


def q6k_loop(rows):
    body = []
    for k in range(4):  # the 4 lines of a 16-value sub-block
        body.append(f"vmovdqu64 {64 * k}(%[w]), %%zmm28")
        body.append(f"vmovdqu64 {64 * k + 256}(%[w]), %%zmm27")
        body.append("vpsllw $4, %%zmm27, %%zmm27")
        body.append("vpandd %%zmm26, %%zmm27, %%zmm27")
        body.append("vpternlogd $0xEC, %%zmm29, %%zmm27, %%zmm28")
        for r in range(rows):
            body.append(f"vpdpbusd {64 * r + 4 * k}(%[x])%{{1to16%}}, %%zmm28, %%zmm{r}")
    body += ["vpmovsxbw 512(%[w]), %%zmm30", "vpslld $16, %%zmm30, %%zmm30", "vpsrad $16, %%zmm30, %%zmm30"]
    return body + scale_rows(rows, 30), 4 * rows


LOOPS = {"dpbusd": dpbusd_loop, "bcast": bcast_loop, "q4k": q4k_loop, "q6k": q6k_loop}
PIPE_OPS = {
    "vpmulld": "vpmulld %%zmm{s}, %%zmm{d}, %%zmm{d}",
    "vpdpwssd": "vpdpwssd %%zmm{s}, %%zmm{s}, %%zmm{d}",
    "vfmadd231ps": "vfmadd231ps %%zmm{s}, %%zmm{s}, %%zmm{d}",
    "vmulps": "vmulps %%zmm{s}, %%zmm{d}, %%zmm{d}",
    "vpaddd": "vpaddd %%zmm{s}, %%zmm{d}, %%zmm{d}",
    "vpandd": "vpandd %%zmm{s}, %%zmm{d}, %%zmm{d}",
    "vcvtdq2ps": "vcvtdq2ps %%zmm{s}, %%zmm{d}",
}


def pipe_loop(op):
    # The dpbusd loop's 96 dots (12 chains) with `op` after every 8th, into 4 registers of its own.
    def loop(rows):
        dots, extra = dpbusd_loop(rows)
        body = []
        for i, dot in enumerate(dots):
            body.append(dot)
            if i % 8 == 7:
                body.append(PIPE_OPS[op].format(d=12 + i // 8 % 4, s=16 + i // 8 % 4))
        return body, extra
    return loop


def source(rows, seconds, loops):
    out = [
        "#include <chrono>", "#include <cstdint>", "#include <cstdio>",
        "alignas(64) int8_t X[64 * 16];", "alignas(64) uint8_t W[64 * 16];",
        "using Clock = std::chrono::steady_clock;",
    ]
    for name, loop in loops.items():
        body, dots = loop(rows)
        text = "\\n\\t".join(body)
        out.append(f"""double {cname(name)}() {{
  const int8_t* x = X;
  const uint8_t* w = W;
  long iters = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {{
    for (int i = 0; i < 10000; ++i) asm volatile("{text}" :: [x] "r"(x), [w] "r"(w) : "memory");
    iters += 10000;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }} while (s < {seconds});
  return iters * {dots} / s / 1e9;
}}""")
    out.append(f"""double scalar() {{
  uint64_t a = 1, b = 2, c = 3, d = 4;
  long iters = 0;
  const auto t0 = Clock::now();
  double s = 0;
  do {{
    for (int i = 0; i < 1000000; ++i) {{
      a = a * 3 + 1; b = b * 5 + 1; c = c * 7 + 1; d = d * 9 + 1;
      asm volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
    }}
    iters += 1000000;
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }} while (s < {seconds});
  return iters / s / 1e9;
}}""")
    calls = ", ".join(f"{cname(name)}()" for name in loops)
    fmt = "  ".join(f"{name} %.2f" for name in loops)
    out.append(f'int main() {{ std::printf("{fmt}  scalar %.3f\\n", {calls}, scalar()); }}')
    return "\n".join(out) + "\n"


def cname(name):
    return "loop_" + name.replace("+", "with_")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=9, help="activation rows of the tile loops (1-12)")
    ap.add_argument("--seconds", type=float, default=0.5, help="time per loop")
    ap.add_argument("--cpus", default=None, help="vCPUs to pin to, comma-separated (default: all allowed)")
    ap.add_argument("--pipes", action="store_true", help="also the dpbusd loop with one other op every 8 dots")
    args = ap.parse_args()
    if not 1 <= args.rows <= 12:
        sys.exit("kernel_floor: --rows must be 1-12 (the loops keep 2 sums a row in the 32 vector registers)")
    with open("/proc/cpuinfo") as f:
        if "avx512_vnni" not in f.read():
            print("kernel_floor: this CPU has no AVX-512 VNNI; the loops are vpdpbusd (the avx512 kernel set's)")
            sys.exit(77)  # CTest's skip code
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "floor.cpp"), os.path.join(tmp, "floor")
        with open(src, "w") as f:
            loops = dict(LOOPS)
            if args.pipes:
                loops.update({f"+{op}": pipe_loop(op) for op in PIPE_OPS})
            f.write(source(args.rows, args.seconds, loops))
        build = subprocess.run(["g++", "-O2", "-mavx512f", "-mavx512bw", "-mavx512vnni", src, "-o", exe],
                               capture_output=True, text=True)
        if build.returncode != 0:
            sys.exit("kernel_floor: g++ failed:\n" + build.stderr)
        print(f"G vpdpbusd a second ({args.rows} rows in bcast / q4k / q6k; +OP: dpbusd with one OP every 8 dots);"
              " scalar: G multiply-add iterations a second")
        for cpu in cpus:
            run = subprocess.run(["taskset", "-c", str(cpu), exe], capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"kernel_floor: the loops failed on vCPU {cpu}: {run.stderr.strip()}")
            print(f"vCPU {cpu}: {run.stdout.strip()}")


if __name__ == "__main__":
    main()
