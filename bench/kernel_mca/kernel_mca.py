#!/usr/bin/env python3
"""Static cost of the CPU backend's few-row tiles, per 128-value group, by llvm-mca.

Shared VMs have no performance counters and their wall-clock times vary by 30 % within minutes, so a
kernel change is judged here first: the group loop of tile_x32 (plugins/cpu/qkernels_x32.cpp) is marked
with llvm-mca region comments in a copy of the source (the group is taken as full, n = 4, so that the
partial-group branch does not count), compiled to assembly with the backend's flags for each kernel set,
and every region (one per tile shape the rows() instantiations inline) is run through llvm-mca.

  python3 bench/kernel_mca/kernel_mca.py [--source FILE] [--cpu sapphirerapids|znver3|...] [TYPE ...]

TYPE is an Unpack name prefix (Q4_0, Q8_0, Q5_0, IQ4_NL, ...). Needs g++ and llvm-mca (Debian llvm-14).
Prints, per kernel set and type: the region's instructions, its dot instructions (vpdpbusd: 2 per
(weight row, activation row) pair; AVX2 vpmaddubsw: 4 per pair) and llvm-mca's cycles per group.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FLAGS = {
    "avx512": "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni",
    "avx2": "",
}


def marked_source(src):
    group = """    const int n = chunk.b1 - b < 4 ? static_cast<int>(chunk.b1 - b) : 4;
    const int64_t g = b / 4;"""
    if src.count(group) != 2:
        sys.exit("kernel_mca: the group loop of tile_x32 changed; update marked_source()")
    src = src.replace(group, '    asm volatile("# LLVM-MCA-BEGIN");\n' + group.replace(
        "chunk.b1 - b < 4 ? static_cast<int>(chunk.b1 - b) : 4", "4"))
    ends = [
        """        if constexpr (kAffine) acc[i][r] = _mm512_fmadd_ps(bw[i], _mm512_loadu_ps(xm[r] + 16 * g), acc[i][r]);
      }
    }
  }""",
        """            acc[h][i][r] = _mm256_fmadd_ps(bw[i][h], _mm256_loadu_ps(xm[r] + 16 * g + 8 * h), acc[h][i][r]);
        }
      }
  }""",
    ]
    for end in ends:
        if end not in src:
            sys.exit("kernel_mca: the end of tile_x32's group loop changed; update marked_source()")
        src = src.replace(end, end[:-4] + '\n    asm volatile("# LLVM-MCA-END");\n  }')
    return src


def regions(asm_lines, type_name):
    """Yields the marked regions of the rows<X32Tiles<type_name...>> functions, in order."""
    key = "rowsINS2_8X32TilesINS2_%d%sUnpack" % (len(type_name) + 6, type_name)
    starts = [i for i, l in enumerate(asm_lines) if l.startswith("_Z") and l.endswith(":") and key in l]
    for i in starts:
        j = i + 1
        while j < len(asm_lines) and not (asm_lines[j].startswith("_Z") and asm_lines[j].endswith(":")):
            j += 1
        cur = None
        for line in asm_lines[i:j]:
            if "LLVM-MCA-BEGIN" in line:
                cur = []
            elif "LLVM-MCA-END" in line and cur is not None:
                yield cur
                cur = None
            elif cur is not None:
                cur.append(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=os.path.join(ROOT, "plugins/cpu/qkernels_x32.cpp"))
    ap.add_argument("--cpu", default="sapphirerapids")
    ap.add_argument("types", nargs="*", default=["Q4_0", "Q8_0"])
    a = ap.parse_args()
    mca = shutil.which("llvm-mca") or shutil.which("llvm-mca-14")
    if not mca:
        sys.exit("kernel_mca: llvm-mca not found (apt-get install llvm-14)")
    with tempfile.TemporaryDirectory() as tmp:
        cpp = os.path.join(tmp, "qkernels_x32.cpp")
        with open(a.source) as f:
            src = marked_source(f.read())
        with open(cpp, "w") as f:
            f.write(src)
        for isa, flags in FLAGS.items():
            asm = os.path.join(tmp, isa + ".s")
            cmd = (f"c++ -DSPECULA_ISA_NS={isa} -O3 -DNDEBUG -fPIC -fvisibility=hidden -mavx2 -mfma -mf16c {flags} "
                   f"-std=c++20 -I{os.path.join(ROOT, 'plugins/cpu')} -S {cpp} -o {asm}")
            subprocess.run(cmd, shell=True, check=True)
            with open(asm) as f:
                lines = f.read().split("\n")
            for t in a.types:
                for k, body in enumerate(regions(lines, t)):
                    ins = [x for x in body if x.startswith("\t") and not x.strip().startswith(".")]
                    dots = sum(("vpdpbusd" in x) or ("vpmaddubsw" in x) for x in ins)
                    calls = sum(x.strip().startswith("call") for x in ins)
                    reg = os.path.join(tmp, "region.s")
                    with open(reg, "w") as f:
                        f.write("\n".join(body) + "\n")
                    out = subprocess.run([mca, f"-mcpu={a.cpu}", "-iterations=200", reg], capture_output=True,
                                         text=True).stdout
                    m = re.search(r"Total Cycles:\s+(\d+)", out)
                    cycles = int(m.group(1)) / 200 if m else float("nan")
                    print(f"{isa:6} {t:7} region {k:2}: {len(ins):4} instructions, {dots:2} dot instructions, "
                          f"{calls} calls, {cycles:6.1f} cycles per group")


if __name__ == "__main__":
    main()
