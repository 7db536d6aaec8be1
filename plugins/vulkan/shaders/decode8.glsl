// Eight weight values at a time, read as whole words: values [32 c + 8 p, 32 c + 8 p + 8) of the weight
// row `row` (binding 0), part p (0-3) of chunk c, exactly as decode_chunk (common.glsl) and the SDK decode
// them (the same roundings: `precise` where decode_chunk has it). Four threads decoding the four parts
// of neighbouring chunks read neighbouring bytes, so a subgroup's loads coalesce (matvec.comp).

// The 4 bytes at byte offset `off` of binding 0 (any alignment), with one or two word loads.
uint bytes4(uint off) {
  uint a = off >> 2, sh = (off & 3u) * 8u;
  uint w0 = b0.d[a];
  return sh == 0u ? w0 : (w0 >> sh) | (b0.d[a + 1u] << (32u - sh));
}
// The fp16 at an even byte offset.
float half_at(uint off) {
  uint w = b0.d[off >> 2];
  return half_bits((off & 2u) != 0u ? (w >> 16) : (w & 0xFFFFu));
}
uint byte_of(uvec2 v, uint k) { return ((k < 4u ? v.x : v.y) >> (8u * (k & 3u))) & 0xFFu; }
uvec2 bytes8(uint off) { return uvec2(bytes4(off), bytes4(off + 4u)); }

void decode8(uint type, uint row, uint cols, uint c, uint p, out float w[8]) {
  uint j0 = 8u * p;  // the first value within the chunk
  if (type == T_F32 || type == T_F16 || type == T_BF16) {
    uint base = row * cols, e0 = c * 32u + j0;
    for (uint k = 0u; k < 8u; ++k) w[k] = e0 + k < cols ? load0(type, base + e0 + k) : 0.0;
    return;
  }
  if (type == T_MLX) {
    uint bits = pc.p[PC_MLX_BITS], mask = (1u << bits) - 1u, st = pc.p[PC_MLX_SCALE_TYPE];
    uint g = row * (cols / pc.p[PC_MLX_GROUP]) + c * 32u / pc.p[PC_MLX_GROUP];
    float s = load3(st, g), bias = load4(st, g);
    uint base = row * (cols / 32u * bits) + c * bits;
    for (uint k = 0u; k < 8u; ++k) {
      uint q = (j0 + k) * bits, wd = base + (q >> 5), sh = q & 31u;
      uint v = b0.d[wd] >> sh;
      if (sh + bits > 32u) v |= b0.d[wd + 1u] << (32u - sh);
      precise float y = s * float(v & mask);
      w[k] = y + bias;
    }
    return;
  }
  uint off = row * row_bytes(type, cols);
  if (type == T_Q8_0) {
    uint b = off + c * 34u;
    float d = half_at(b);
    uvec2 q = bytes8(b + 2u + j0);
    for (uint k = 0u; k < 8u; ++k) w[k] = float(int(byte_of(q, k) << 24) >> 24) * d;
  } else if (type == T_Q4_0 || type == T_IQ4_NL) {
    // Values j < 16 are the low nibbles of qs[j], the others the high nibbles of qs[j - 16].
    uint b = off + c * 18u;
    float d = half_at(b);
    uvec2 q = bytes8(b + 2u + (j0 & 15u));
    uint sh = j0 >= 16u ? 4u : 0u;
    for (uint k = 0u; k < 8u; ++k) {
      uint v = (byte_of(q, k) >> sh) & 0xFu;
      w[k] = type == T_Q4_0 ? float(int(v) - 8) * d : d * float(kIq4nl[v]);
    }
  } else if (type == T_Q4_1 || type == T_Q5_1) {
    bool five = type == T_Q5_1;
    uint b = off + c * (five ? 24u : 20u);
    float d = half_at(b), m = half_at(b + 2u);
    uint qh = five ? bytes4(b + 4u) : 0u;
    uvec2 q = bytes8(b + (five ? 8u : 4u) + (j0 & 15u));
    uint sh = j0 >= 16u ? 4u : 0u;
    for (uint k = 0u; k < 8u; ++k) {
      uint j = j0 + k;
      precise float y = float(((byte_of(q, k) >> sh) & 0xFu) | (((qh >> j) & 1u) << 4)) * d;
      w[k] = y + m;
    }
  } else if (type == T_Q5_0) {
    uint b = off + c * 22u;
    float d = half_at(b);
    uint qh = bytes4(b + 2u);
    uvec2 q = bytes8(b + 6u + (j0 & 15u));
    uint sh = j0 >= 16u ? 4u : 0u;
    for (uint k = 0u; k < 8u; ++k) {
      uint j = j0 + k;
      w[k] = float(int(((byte_of(q, k) >> sh) & 0xFu) | (((qh >> j) & 1u) << 4)) - 16) * d;
    }
  } else if (type == T_IQ4_XS) {
    uint b = off + (c / 8u) * 136u, ib = c % 8u;
    uint head = bytes4(b);  // d, then the 2-bit high parts of the 8 scales
    uint high = head >> 16;
    uint ls = ((bytes4(b + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((high >> (2u * ib)) & 3u) << 4);
    precise float dl = half_bits(head & 0xFFFFu) * float(int(ls) - 32);
    uvec2 q = bytes8(b + 8u + ib * 16u + (j0 & 15u));
    uint sh = j0 >= 16u ? 4u : 0u;
    for (uint k = 0u; k < 8u; ++k) w[k] = dl * float(kIq4nl[(byte_of(q, k) >> sh) & 0xFu]);
  } else if (type == T_Q4_K || type == T_Q5_K) {
    bool five = type == T_Q5_K;
    uint b = off + (c / 8u) * (five ? 176u : 144u), sub = c % 8u, pair = sub / 2u;
    uint head = b0.d[b >> 2];  // super-blocks are whole words
    float d = half_bits(head & 0xFFFFu), dmin = half_bits(head >> 16);
    uint sc, m;
    scale_min_k4(b + 4u, sub, sc, m);
    precise float d1 = d * float(sc), m1 = dmin * float(m);
    uvec2 q = bytes8(b + (five ? 48u : 16u) + pair * 32u + j0);
    uvec2 h = five ? bytes8(b + 16u + j0) : uvec2(0u);
    uint sh = (sub & 1u) != 0u ? 4u : 0u;
    for (uint k = 0u; k < 8u; ++k) {
      uint v = (byte_of(q, k) >> sh) & 0xFu;
      if (five && (byte_of(h, k) & (1u << sub)) != 0u) v += 16u;
      precise float y = d1 * float(v);
      w[k] = y - m1;
    }
  } else {  // Q6_K
    uint b = off + (c / 8u) * 210u, sub = c % 8u, n = sub / 4u, qq = sub % 4u;
    float d = half_at(b + 208u);
    uvec2 lo = bytes8(b + n * 64u + (qq & 1u) * 32u + j0);
    uvec2 hi = bytes8(b + 128u + n * 32u + j0);
    int scale = int(byte0(b + 192u + n * 8u + j0 / 16u + 2u * qq) << 24) >> 24;
    precise float y = d * float(scale);
    uint sl = qq >= 2u ? 4u : 0u, shh = 2u * qq;
    for (uint k = 0u; k < 8u; ++k) {
      int q = int(((byte_of(lo, k) >> sl) & 0xFu) | (((byte_of(hi, k) >> shh) & 3u) << 4)) - 32;
      w[k] = y * float(q);
    }
  }
}
