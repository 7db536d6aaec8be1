// The push constants of every shader: the index of each parameter in `pc.p[32]` (uint words; floats as
// their bits). Included by common.glsl and by the lowering (vk_lower.cpp), so a shader and the dispatch
// that feeds it read one layout. Valid GLSL and C++ (preprocessor only).
#ifndef SPECULA_VULKAN_PUSH_CONSTANTS_H
#define SPECULA_VULKAN_PUSH_CONSTANTS_H

// attention.comp
#define PC_ATT_T 0
#define PC_ATT_HQ 1
#define PC_ATT_D 2
#define PC_ATT_S 3
#define PC_ATT_HKV 4
#define PC_ATT_DV 5
#define PC_ATT_SCALE 6      // float
#define PC_ATT_WINDOW 7
#define PC_ATT_CAUSAL 8
#define PC_ATT_K_TYPE 9
#define PC_ATT_V_TYPE 10
#define PC_ATT_IN_USE 11    // 1 when operand 5 (the slots in use) is bound
#define PC_ATT_CHUNK 12     // slots per workgroup when the slots are split (0: one pass, the output)
#define PC_ATT_CHUNKS 13    // workgroups per (query, head): partial results for attention_combine.comp

// copy.comp: Slice, Concat, Copy, WriteRows, Scatter, Gather (the meaning of 2 and 3 depends on the op)
#define PC_COPY_OP 0        // 0 Slice, 1 Concat, 2 Copy, 3 WriteRows, 4 Scatter, 5 Gather
#define PC_COPY_WORDS 1     // words out (Scatter: values)
#define PC_COPY_COLS 2      // Slice: source cols; Concat: a's cols; WriteRows, Gather: C
#define PC_COPY_ARG 3       // Slice: start; Concat: b's cols; WriteRows, Gather: R; Scatter: N
#define PC_COPY_OUT_COLS 4  // Slice: length
#define PC_COPY_TYPE 5      // Copy, WriteRows: destination dtype
#define PC_COPY_N 6         // WriteRows: rows written
#define PC_COPY_NODE 7      // for range errors
#define PC_COPY_COUNT 8     // Copy: values

// elementwise.comp
#define PC_EW_OP 0          // 0 add, 1 mul, 2 scale, 3 gelu, 4 softcap, 5 div, 6 clamp
#define PC_EW_COUNT 1
#define PC_EW_A_DIMS 3      // 6 words: a's dims, outermost first, padded with 1s
#define PC_EW_B_STRIDES 9   // 6 words: b's strides (0 on broadcast axes)
#define PC_EW_F0 15         // float: scale, softcap, clamp's lo
#define PC_EW_F1 16         // float: clamp's hi

// get_rows.comp (also the conversion of a stored operand to F32: identity ids)
#define PC_GR_TYPE 0
#define PC_GR_R 1
#define PC_GR_C 2
#define PC_GR_ROWS 3
#define PC_GR_IDENTITY 4
#define PC_GR_NODE 5
#define PC_GR_FIRST 6       // the table rows [first, end) bound at binding 0 (a window)
#define PC_GR_END 7

// matmul.comp
#define PC_MM_TYPE 0
#define PC_MM_O 1
#define PC_MM_I 2
#define PC_MM_N 3           // activation rows
#define PC_MM_MODE 4        // 0 matmul, 1 matmul_id
#define PC_MM_K 5
#define PC_MM_X_SHARED 6    // x has one row per token for all K
#define PC_MM_E 7
#define PC_MM_NODE 8
#define PC_MM_WIN_FIRST 9   // the window bound at binding 0: matmul: first output column; matmul_id: first expert
#define PC_MM_WIN_COUNT 10  // matmul: columns in the window; matmul_id: end expert
#define PC_MM_TPR 11        // threads per weight row

// rope.comp
#define PC_ROPE_T 0
#define PC_ROPE_H 1
#define PC_ROPE_D 2
#define PC_ROPE_PAIRS 3

// rows.comp
#define PC_ROWS_OP 0        // 0 RmsNorm, 1 Softmax
#define PC_ROWS_COLS 1
#define PC_ROWS_EPS 2       // float
#define PC_ROWS_HAS_WEIGHT 3

// topk.comp
#define PC_TOPK_COLS 0
#define PC_TOPK_K 1

// top_p_draw.comp
#define PC_DRAW_K 0
#define PC_DRAW_TOP_P 1     // float
#define PC_DRAW_MIN_P 2     // float
#define PC_DRAW_INV_T 3     // float: 1 / temperature

// accept_drafts.comp
#define PC_AD_N 0           // drafts
#define PC_AD_V 1           // vocabulary (row length of the logits)
#define PC_AD_K 2           // the target's TopK width
#define PC_AD_KQ 3          // the drafter's TopK width
#define PC_AD_TOP_P 4       // float
#define PC_AD_MIN_P 5       // float
#define PC_AD_INV_T 6       // float: 1 / temperature
#define PC_AD_NODE 7        // for a draft outside the vocabulary

// MLX affine weights, decoded by get_rows.comp and matmul.comp (scales and biases at bindings 3 and 4)
#define PC_MLX_BITS 24
#define PC_MLX_GROUP 25
#define PC_MLX_SCALE_TYPE 26

#endif
