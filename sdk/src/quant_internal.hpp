// Per-block codecs of the ggml types (one block in, one block out), used by quant.cpp's row dispatch.
#pragma once

namespace specula::detail {

void dequant_q8_0(const unsigned char* b, float* y);
void dequant_q4_0(const unsigned char* b, float* y);
void dequant_q4_1(const unsigned char* b, float* y);
void dequant_q5_0(const unsigned char* b, float* y);
void dequant_q5_1(const unsigned char* b, float* y);
void dequant_q4_k(const unsigned char* b, float* y);
void dequant_q5_k(const unsigned char* b, float* y);
void dequant_q6_k(const unsigned char* b, float* y);
void dequant_iq4_nl(const unsigned char* b, float* y);
void dequant_iq4_xs(const unsigned char* b, float* y);

void quant_q8_0(const float* x, unsigned char* b);
void quant_q4_0(const float* x, unsigned char* b);
void quant_q4_1(const float* x, unsigned char* b);
void quant_q5_0(const float* x, unsigned char* b);
void quant_q5_1(const float* x, unsigned char* b);
void quant_q4_k(const float* x, unsigned char* b);
void quant_q5_k(const float* x, unsigned char* b);
void quant_q6_k(const float* x, unsigned char* b);
void quant_iq4_nl(const float* x, unsigned char* b);
void quant_iq4_xs(const float* x, unsigned char* b);

}  // namespace specula::detail
