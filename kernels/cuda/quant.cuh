/* quant.cuh — device-side decoding of GGUF weight rows, 32 elements at a time.
 *
 * dq32<TYPE>(row, g, out) writes elements [32g, 32g + 32) of a row that starts at `row`
 * (rows are whole numbers of blocks). The same function backs load-time dequantization,
 * embedding lookups and the weight-only GEMV that multiplies quantized weights directly.
 * Block layouts as ggml defines them (common/dtype.h); blocks of 18/20/34/210 bytes are
 * unaligned, so multi-byte fields are assembled from bytes. */
#ifndef MEDLEY_KERNELS_CUDA_QUANT_CUH
#define MEDLEY_KERNELS_CUDA_QUANT_CUH

#include "common/dtype.h"
#include "kernels/cuda/cuda_internal.h"

__device__ __forceinline__ float qt_f16(const uint8_t *p) {
    return cuda_f16_to_f((uint16_t)(p[0] | (p[1] << 8)));
}

template <int T> __device__ __forceinline__ void dq32(const uint8_t *row, int64_t g, float *o);

template <>
__device__ __forceinline__ void dq32<MD_TYPE_F32>(const uint8_t *row, int64_t g, float *o) {
    const float *s = (const float *)row + g * 32;
    for (int j = 0; j < 32; j++)
        o[j] = s[j];
}
template <>
__device__ __forceinline__ void dq32<MD_TYPE_F16>(const uint8_t *row, int64_t g, float *o) {
    const uint16_t *s = (const uint16_t *)row + g * 32;
    for (int j = 0; j < 32; j++)
        o[j] = cuda_f16_to_f(s[j]);
}
template <>
__device__ __forceinline__ void dq32<MD_TYPE_BF16>(const uint8_t *row, int64_t g, float *o) {
    const uint16_t *s = (const uint16_t *)row + g * 32;
    for (int j = 0; j < 32; j++)
        o[j] = cuda_bf16_to_f(s[j]);
}
/* Q4_0: f16 d; u8 qs[16]; x = (q - 8) d; low nibbles are elements 0..15, high 16..31. */
template <>
__device__ __forceinline__ void dq32<MD_TYPE_Q4_0>(const uint8_t *row, int64_t g, float *o) {
    const uint8_t *p = row + g * 18;
    float d = qt_f16(p);
    for (int j = 0; j < 16; j++) {
        o[j] = ((p[2 + j] & 0xF) - 8) * d;
        o[j + 16] = ((p[2 + j] >> 4) - 8) * d;
    }
}
/* Q4_1: f16 d, m; u8 qs[16]; x = q d + m. */
template <>
__device__ __forceinline__ void dq32<MD_TYPE_Q4_1>(const uint8_t *row, int64_t g, float *o) {
    const uint8_t *p = row + g * 20;
    float d = qt_f16(p), m = qt_f16(p + 2);
    for (int j = 0; j < 16; j++) {
        o[j] = (p[4 + j] & 0xF) * d + m;
        o[j + 16] = (p[4 + j] >> 4) * d + m;
    }
}
/* Q8_0: f16 d; i8 qs[32]; x = q d. */
template <>
__device__ __forceinline__ void dq32<MD_TYPE_Q8_0>(const uint8_t *row, int64_t g, float *o) {
    const uint8_t *p = row + g * 34;
    float d = qt_f16(p);
    for (int j = 0; j < 32; j++)
        o[j] = (int8_t)p[2 + j] * d;
}
/* Q4_K (256 per block): f16 d, dmin; u8 scales[12] packing eight 6-bit (scale, min) pairs;
 * u8 qs[128]. Sub-block j uses the low (j even) or high (j odd) nibbles of qs[32 (j/2)..]. */
template <>
__device__ __forceinline__ void dq32<MD_TYPE_Q4_K>(const uint8_t *row, int64_t g, float *o) {
    const uint8_t *p = row + (g / 8) * 144;
    int j = (int)(g % 8);
    float d = qt_f16(p), dmin = qt_f16(p + 2);
    const uint8_t *qs = p + 16 + 32 * (j / 2);
    int s, m;
    md_q4k_scale_min(p + 4, j, &s, &m);
    float d1 = d * s, m1 = dmin * m;
    int shift = (j & 1) * 4;
    for (int l = 0; l < 32; l++)
        o[l] = d1 * ((qs[l] >> shift) & 0xF) - m1;
}
/* Q6_K (256 per block): u8 ql[128], qh[64]; i8 scales[16]; f16 d. Two halves of 128; group
 * q (0..3) of a half takes its low 4 bits from nibble q/2 of ql[l + 32 (q&1)] and its high
 * 2 bits from qh[l] >> 2q; x = d * scales[l/16 + 2q] * (q6 - 32). */
template <>
__device__ __forceinline__ void dq32<MD_TYPE_Q6_K>(const uint8_t *row, int64_t g, float *o) {
    const uint8_t *p = row + (g / 8) * 210;
    int half = (int)(g % 8) / 4, q = (int)(g % 4);
    const uint8_t *ql = p + 64 * half + 32 * (q & 1), *qh = p + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(p + 192) + 8 * half + 2 * q;
    float d = qt_f16(p + 208);
    int lshift = (q & 2) ? 4 : 0;
    for (int l = 0; l < 32; l++) {
        int v = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> (2 * q)) & 3) << 4);
        o[l] = d * sc[l / 16] * (v - 32);
    }
}

static inline int qt_is_quant(int t) {
    return t != MD_TYPE_F32 && t != MD_TYPE_F16 && t != MD_TYPE_BF16;
}

/* What a row length must be a multiple of for dq32: the type's block, at least the
 * 32-element group (so 32 for the float types); 0 for a type the kernels do not take. */
static inline int qt_block_elems(int t) {
    int b = md_type_supported(t) ? md_type_block(t) : 0;
    return b > 0 && b < 32 ? 32 : b;
}

/* Call F.template operator()<TYPE>() for a runtime type; returns 0, or -1 if unsupported. */
#define QT_DISPATCH(t, ...)                                                                        \
    do {                                                                                           \
        switch (t) {                                                                               \
        case MD_TYPE_F32: {                                                                        \
            constexpr int QT = MD_TYPE_F32;                                                        \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_F16: {                                                                        \
            constexpr int QT = MD_TYPE_F16;                                                        \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_BF16: {                                                                       \
            constexpr int QT = MD_TYPE_BF16;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_Q4_0: {                                                                       \
            constexpr int QT = MD_TYPE_Q4_0;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_Q4_1: {                                                                       \
            constexpr int QT = MD_TYPE_Q4_1;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_Q8_0: {                                                                       \
            constexpr int QT = MD_TYPE_Q8_0;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_Q4_K: {                                                                       \
            constexpr int QT = MD_TYPE_Q4_K;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case MD_TYPE_Q6_K: {                                                                       \
            constexpr int QT = MD_TYPE_Q6_K;                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

#endif
