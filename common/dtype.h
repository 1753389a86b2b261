/* dtype.h — tensor element types (md_type_*): the one list of GGUF's tensor types, numbered
 * as ggml's enum ggml_type because GGUF files store these numbers; each type's name, block
 * size and bytes; half and bfloat16 <-> float conversion; and the unpacking of Q4_K's packed
 * sub-block scales. Every layer takes its type facts from here: engine/weights/gguf.c sizes a file's
 * tensors of any type (so files holding types medley cannot compute with still open and
 * list), engine/weights/quant.c and the backends compute with the types md_type_supported() names.
 *
 * Block layouts (little-endian, packed, as llama.cpp writes them; x is an element's value):
 *   Q4_0  32 el,  18 B: f16 d | u8 qs[16]            x = (nibble - 8) * d
 *   Q4_1  32 el,  20 B: f16 d | f16 m | u8 qs[16]    x = nibble * d + m
 *   Q8_0  32 el,  34 B: f16 d | i8 qs[32]            x = q * d
 *   Q5_0  32 el,  22 B: f16 d | u32 qh | u8 qs[16]   x = ((nibble | (bit j of qh) << 4) - 16) * d
 *     (read only: dequantized, or recoded exactly as Q8_0 at load, engine/weights/quant.h)
 *     (in Q4_*, element j < 16 is the low nibble of qs[j], element j + 16 the high one)
 *   Q4_K 256 el, 144 B: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *     8 sub-blocks of 32, each with a 6-bit scale sc and min m packed into scales
 *     (md_q4k_scale_min); 64-element chunk c uses qs[32c..32c+31], its low nibbles are
 *     sub-block 2c, its high nibbles 2c+1; x = d * sc * nibble - dmin * m
 *   Q5_K 256 el, 176 B: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
 *     Q4_K with a fifth bit: element l of sub-block s is (nibble | (bit s of qh[l]) << 4),
 *     x = d * sc * q5 - dmin * m (read only: the CPU backend multiplies by it; a backend
 *     without it refuses the tensor, engine/model/model_load.c)
 *   Q6_K 256 el, 210 B: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
 *     16 sub-blocks of 16 with a plain int8 scale (nothing to unpack); x = d * scale * (q - 32),
 *     q = 4 bits from ql and 2 from qh (engine/weights/quant.c deq_q6_k spells out which)
 *
 * The conversions and md_q4k_scale_min are inline: the dequantizers and CPU kernels call them
 * per element or per block. The header is C and C++ (the CUDA kernels and their emulator
 * include it); md_q4k_scale_min is host and device code under nvcc. Nothing here allocates. */
#ifndef MEDLEY_COMMON_DTYPE_H
#define MEDLEY_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGUF tensor types. medley computes with eight of them (md_type_supported, marked *); the
 * others are listed so that files holding them open, list and size correctly. The gaps
 * (4, 5, 31..33) are types ggml removed. */
typedef enum {
    MD_TYPE_F32 = 0,  /* * */
    MD_TYPE_F16 = 1,  /* * */
    MD_TYPE_Q4_0 = 2, /* * */
    MD_TYPE_Q4_1 = 3, /* * */
    MD_TYPE_Q5_0 = 6,
    MD_TYPE_Q5_1 = 7,
    MD_TYPE_Q8_0 = 8, /* * */
    MD_TYPE_Q8_1 = 9,
    MD_TYPE_Q2_K = 10,
    MD_TYPE_Q3_K = 11,
    MD_TYPE_Q4_K = 12, /* * */
    MD_TYPE_Q5_K = 13,
    MD_TYPE_Q6_K = 14, /* * */
    MD_TYPE_Q8_K = 15,
    MD_TYPE_IQ2_XXS = 16,
    MD_TYPE_IQ2_XS = 17,
    MD_TYPE_IQ3_XXS = 18,
    MD_TYPE_IQ1_S = 19,
    MD_TYPE_IQ4_NL = 20,
    MD_TYPE_IQ3_S = 21,
    MD_TYPE_IQ2_S = 22,
    MD_TYPE_IQ4_XS = 23,
    MD_TYPE_I8 = 24,
    MD_TYPE_I16 = 25,
    MD_TYPE_I32 = 26,
    MD_TYPE_I64 = 27,
    MD_TYPE_F64 = 28,
    MD_TYPE_IQ1_M = 29,
    MD_TYPE_BF16 = 30, /* * */
    MD_TYPE_TQ1_0 = 34,
    MD_TYPE_TQ2_0 = 35,
} md_type;

/* Name as ggml spells it ("Q4_K"); NULL for a number that is no GGUF type. */
const char *md_type_name(int type);
/* Elements per block (1 for F32, F16, BF16 and the integer types); 0 if unknown. */
int md_type_block(int type);
/* Bytes per block; 0 if unknown. */
size_t md_type_block_bytes(int type);
/* Bytes of a row of n elements; 0 if the type is unknown, n < 0 or n is not a multiple of
 * the block size. */
size_t md_type_row_bytes(int type, int64_t n);
/* 1 for the eight types medley computes with (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K:
 * engine/weights/quant.c dequantizes them and every backend multiplies by them), else 0. */
int md_type_supported(int type);

/* Host-and-device inline functions: under nvcc they compile for both sides. */
#ifdef __CUDACC__
#define MD_HOSTDEV_INLINE static __host__ __device__ __forceinline__
#else
#define MD_HOSTDEV_INLINE static inline
#endif

/* IEEE half -> single, exact. The half's exponent and mantissa, moved to the single's
 * positions, read as a single are the value times 2^-112 (subnormal halves land on
 * subnormal singles, which the multiply makes normal again), so one multiply by 2^112
 * finishes it; inf/NaN get the single's all-ones exponent first (a signalling NaN comes out
 * quiet). Branch-free, so row loops vectorize. */
static inline float md_fp16_to_fp32(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fff) << 13;
    em |= (h & 0x7c00) == 0x7c00 ? 0x7f800000u : 0;
    float f;
    memcpy(&f, &em, 4);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* Single -> half, round to nearest even; subnormals and inf kept, a NaN stays a (quiet) NaN
 * with the top payload bits. */
static inline uint16_t md_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff)
        return sign | 0x7c00 | (man ? 0x200 | (uint16_t)(man >> 13) : 0);
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return sign | 0x7c00;
    if (e <= 0) { /* subnormal half or zero */
        if (e < -10)
            return sign;
        man |= 0x800000;
        int shift = 14 - e; /* 24-bit mantissa down to the half's 10-bit subnormal */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return sign | (uint16_t)half;
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
        half++; /* may carry into the exponent, up to inf: correct rounding */
    return sign | (uint16_t)half;
}

static inline float md_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Single -> bfloat16, round to nearest even; a NaN stays a quiet NaN. */
static inline uint16_t md_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* Q4_K: the 6-bit scale *sc and min *mn of sub-block j (0..7) from a block's 12 packed scale
 * bytes: sub-blocks 0..3 have theirs in the low 6 bits of bytes j and j + 4; sub-blocks 4..7
 * have their low 4 bits in the nibbles of byte j + 4 and their high 2 bits in the top bits
 * of bytes j - 4 (scale) and j (min). */
MD_HOSTDEV_INLINE void md_q4k_scale_min(const uint8_t *scales, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *mn = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        *mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

#ifdef __cplusplus
}
#endif

#endif
