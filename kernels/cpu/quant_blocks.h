/* quant_blocks.h — private to kernels/cpu: ggml's block layouts (fixed by the GGUF format),
 * half/bfloat conversions, the layout of quantized activations in matmul scratch, and the
 * table of per-SIMD-level kernels that matmul.c dispatches to.
 *
 * Block layouts (little-endian, packed, as written by llama.cpp):
 *   Q4_0  32 elems, 18 B: fp16 d; u8 qs[16]        x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q4_1  32 elems, 20 B: fp16 d, m; u8 qs[16]     x[j] = d*(qs[j]&15)+m,   x[j+16] = d*(qs[j]>>4)+m
 *   Q8_0  32 elems, 34 B: fp16 d; i8 qs[32]        x[j] = d*qs[j]
 *   Q4_K 256 elems, 144 B: fp16 d, dmin; u8 scales[12] (8 six-bit scales + 8 six-bit mins);
 *        u8 qs[128]: 64-element chunk c uses qs[32c..32c+31], low nibbles = sub-block 2c,
 *        high nibbles = sub-block 2c+1; x = d*sc[s]*q - dmin*mn[s]
 *   Q6_K 256 elems, 210 B: u8 ql[128], qh[64]; i8 scales[16]; fp16 d;
 *        x = d*scales[i/16]*(q-32), q = 6 bits from ql nibble + 2 bits of qh (see dequant)
 */
#ifndef MEDLEY_KERNELS_CPU_QUANT_BLOCKS_H
#define MEDLEY_KERNELS_CPU_QUANT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QK32 32
#define QK_K 256

typedef struct {
    uint16_t d;
    uint8_t qs[16];
} blk_q4_0;
typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} blk_q4_1;
typedef struct {
    uint16_t d;
    int8_t qs[32];
} blk_q8_0;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} blk_q4_k;
typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} blk_q6_k;

_Static_assert(sizeof(blk_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(blk_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block is 210 bytes");

/* IEEE half -> float, exact (subnormals, inf, nan). */
static inline float cpu_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float cpu_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K: six-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void q4k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Quantized activations of one x row in scratch (row stride act_row_bytes):
 *   int8 q[cols]            at offset 0
 *   float d[cols/32]        per 32-block scale (Q4_0/Q4_1/Q8_0)   | per 256-block (K)
 *   float s[cols/32]        d * sum(q) per 32-block               | int16 bsum[cols/16]
 * x[i] ~= d[blk] * q[i]. */
typedef struct {
    const int8_t *q;
    const float *d;
    const float *s;       /* 32-block types */
    const int16_t *bsum;  /* K types: sums of q over each 16 elements */
} act_row;

/* One kernel computes a tile: rows [0, nr) of W (row stride wstride bytes, nb blocks
 * each) against activations a[0..nc), writing y[c*ldy + r]. nr <= KR, nc <= KC. */
typedef void (*tile_fn)(int nb, const uint8_t *w, size_t wstride, int nr, const act_row *a,
                        const float *const *xf, int nc, float *y, size_t ldy);
#define KR 4
#define KC 4

/* Kernels of one SIMD level, indexed by the CPU_T_* type; NULL = not provided (the
 * scalar table provides all). Float weight types get x rows in xf instead of a. */
typedef void (*quant32_fn)(const float *x, int cols, int8_t *q, float *d, float *s);
typedef void (*quantk_fn)(const float *x, int cols, int8_t *q, float *d, int16_t *bsum);
typedef struct {
    tile_fn f32, f16, bf16, q4_0, q4_1, q8_0, q4_k, q6_k;
    quant32_fn quant32; /* x row -> int8 blocks of 32 with d and s = d*sum(q) */
    quantk_fn quantk;   /* x row -> int8 blocks of 256 with d and 16-element sums */
} kernel_table;

void cpu_quant_q8_32_scalar(const float *x, int cols, int8_t *q, float *d, float *s);
void cpu_quant_q8_k_scalar(const float *x, int cols, int8_t *q, float *d, int16_t *bsum);

extern const kernel_table cpu_kernels_scalar;
extern const kernel_table cpu_kernels_avx2;
extern const kernel_table cpu_kernels_avx512;

#endif
