#version 450
// TopK for k > 4 (topk.comp's k rounds serve fewer), one workgroup per row, in three steps:
//  1. radix select: four passes of 8-bit histograms (shared atomics) over order-preserving keys find
//     the key T of the k-th largest value, and how many values equal to T are taken;
//  2. each thread counts the values above T and those equal to T in its contiguous chunk of the row;
//     prefix sums place them in the result, so the ties kept are those of the lowest indices;
//  3. the k picked indices are sorted in place by (value descending, index ascending), the order of
//     TopK, with a bitonic network in its flip-then-halve form: every comparator puts the earlier
//     entry first, so the virtual entries past k (the network's power-of-two padding) never move and
//     comparators reaching them are skipped.
// A row costs about seven passes over it plus k log^2 k comparisons, instead of k passes: a top-k of
// 40 over a 262144-token vocabulary, or the whole vocabulary sorted for top-p (top_k 0).
// Push constants: PC_TOPK_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 256) in;
shared uint hist[256];
shared uint above[256], ties[256];
shared uint s_prefix, s_need;
// The result again, coherent: the sort's invocations read what the others wrote before each barrier.
layout(std430, set = 0, binding = 5) coherent buffer BOC { uint d[]; } out_ids;

// Larger key, larger value; -0 and +0 (equal values) share a key.
uint key_of(uint i) {
  uint u = b0.d[i];
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// Whether (v, i) ranks before (w, j).
bool before(float v, uint i, float w, uint j) { return v > w || (v == w && i < j); }

// Comparator i of a sort step over blocks of `span` (the first step of each `size` compares mirrored
// positions, the flip; the others halves): the entry that ranks first goes to the lower position.
void compare_swap(uint i, uint span, uint size, uint K, uint base, uint out0) {
  uint half_span = span >> 1;
  uint blk = i / half_span, off = i % half_span, a = blk * span + off;
  uint b = span == size ? blk * span + span - 1u - off : a + half_span;
  if (b >= K) return;  // also every i past the network's P / 2 comparators
  uint ia = out_ids.d[out0 + a], ib = out_ids.d[out0 + b];
  if (before(uintBitsToFloat(b0.d[base + ib]), ib, uintBitsToFloat(b0.d[base + ia]), ia)) {
    out_ids.d[out0 + a] = ib;
    out_ids.d[out0 + b] = ia;
  }
}

void main() {
  uint C = pc.p[PC_TOPK_COLS], K = pc.p[PC_TOPK_K], row = wg_linear(), tid = gl_LocalInvocationID.x;
  uint base = row * C, out0 = row * K;

  // 1. The k-th largest key, a byte at a time from the top.
  uint prefix = 0u, mask = 0u, need = K;
  for (uint pass = 0u; pass < 4u; ++pass) {
    uint shift = 24u - 8u * pass;
    hist[tid] = 0u;
    barrier();
    for (uint c = tid; c < C; c += 256u) {
      uint k = key_of(base + c);
      if ((k & mask) == prefix) atomicAdd(hist[(k >> shift) & 255u], 1u);
    }
    barrier();
    if (tid == 0u) {
      uint b = 255u;
      while (b > 0u && hist[b] < need) {
        need -= hist[b];
        --b;
      }
      s_prefix = prefix | (b << shift);
      s_need = need;
    }
    barrier();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
  }

  // 2. Values above T, then the first `need` equal to T by index.
  uint chunk = (C + 255u) / 256u, c0 = min(C, tid * chunk), c1 = min(C, c0 + chunk);
  uint n_above = 0u, n_ties = 0u;
  for (uint c = c0; c < c1; ++c) {
    uint k = key_of(base + c);
    n_above += k > prefix ? 1u : 0u;
    n_ties += k == prefix ? 1u : 0u;
  }
  above[tid] = n_above;
  ties[tid] = n_ties;
  barrier();
  if (tid == 0u) {
    uint a = 0u, e = 0u;
    for (uint t = 0u; t < 256u; ++t) {
      uint na = above[t], ne = ties[t];
      above[t] = a;
      ties[t] = e;
      a += na;
      e += ne;
    }
  }
  barrier();
  uint at = above[tid], et = ties[tid], first_tie = K - need;
  for (uint c = c0; c < c1; ++c) {
    uint k = key_of(base + c);
    if (k > prefix) {
      out_ids.d[out0 + at] = c;
      ++at;
    } else if (k == prefix) {
      if (et < need) out_ids.d[out0 + first_tie + et] = c;
      ++et;
    }
  }
  memoryBarrierBuffer();
  barrier();

  // 3. Sort the k entries. Four comparators an iteration: llvmpipe (lavapipe) stops a loop after 65535
  // iterations in all, and the 171 steps of a 262144-entry sort at 512 comparators a thread would pass that.
  uint P = 1u;
  while (P < K) P <<= 1;
  for (uint size = 2u; size <= P; size <<= 1) {
    for (uint span = size; span >= 2u; span >>= 1) {
      for (uint i = tid; i < P / 2u; i += 1024u) {
        compare_swap(i, span, size, K, base, out0);
        compare_swap(i + 256u, span, size, K, base, out0);
        compare_swap(i + 512u, span, size, K, base, out0);
        compare_swap(i + 768u, span, size, K, base, out0);
      }
      memoryBarrierBuffer();
      barrier();
    }
  }
}
