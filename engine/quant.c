/* quant.c — ggml element types: sizes, fp16/bf16 conversion, dequantization of F32, F16,
 * BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K and quantization of F32, F16, BF16, Q8_0, Q4_0, Q4_1.
 *
 * These are the plain scalar definitions of each block format (the reference the fast
 * kernels in kernels/ are checked against). Block layouts, little-endian, packed:
 *   Q4_0 (32 el, 18 B): f16 d | u8 qs[16]          x = (nibble - 8) * d
 *   Q4_1 (32 el, 20 B): f16 d | f16 m | u8 qs[16]  x = nibble * d + m
 *   Q8_0 (32 el, 34 B): f16 d | i8 qs[32]          x = q * d
 *     (in Q4_*, element j < 16 is the low nibble of qs[j], element j + 16 the high one)
 *   Q4_K (256 el, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *     8 sub-blocks of 32 with 6-bit scale and min; x = d * sc * nibble - dmin * m
 *   Q6_K (256 el, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
 *     16 sub-blocks of 16; x = d * scale * (6-bit q - 32) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/gguf.h"

/* Block size (elements) and block bytes of every ggml type, so that files holding types we
 * cannot dequantize still open, list and size correctly. Index = ggml_type value. */
static const struct {
    const char *name;
    int blck;
    int size;
} type_table[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 40},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},
};
#define N_TYPES ((int)(sizeof type_table / sizeof type_table[0]))

const char *ggml_type_name(int type) {
    return type >= 0 && type < N_TYPES && type_table[type].name ? type_table[type].name : NULL;
}

int ggml_blck_size(int type) {
    return type >= 0 && type < N_TYPES ? type_table[type].blck : 0;
}

size_t ggml_type_size(int type) {
    return type >= 0 && type < N_TYPES ? (size_t)type_table[type].size : 0;
}

size_t ggml_row_size(int type, int64_t n) {
    int bs = ggml_blck_size(type);
    if (!bs || n < 0 || n % bs)
        return 0;
    return (size_t)(n / bs) * ggml_type_size(type);
}

/* IEEE half -> single, exact. The half's exponent and mantissa, moved to the single's
 * positions, read as a single are the value times 2^-112 (subnormal halves land on
 * subnormal singles, which the multiply makes normal again), so one multiply by 2^112
 * finishes it; inf/NaN get the single's all-ones exponent first. Branch-free, so the
 * row loops vectorize. */
float md_fp16_to_fp32(uint16_t h) {
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

/* single -> half, round to nearest even; subnormals, inf and NaN kept. */
uint16_t md_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) /* inf or NaN (NaN keeps a mantissa bit) */
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

float md_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t md_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return md_fp16_to_fp32(h);
}

static void wr_f16(uint8_t *p, float f) {
    uint16_t h = md_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

static void deq_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b), m = rd_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void deq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++)
        y[j] = (float)qs[j] * d;
}

/* Q4_K's 12 scale bytes pack 8 six-bit scales and 8 six-bit mins. */
static void q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, m;
        q4k_scale_min(is, scales, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        q4k_scale_min(is + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++)
            y[j + l] = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++)
            y[j + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
    }
}

static void deq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = rd_f16(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int h = 0; h < 2; h++) { /* elements l = 16h..16h+15 share their four scales */
            float s1 = d * (float)sc[h], s2 = d * (float)sc[h + 2];
            float s3 = d * (float)sc[h + 4], s4 = d * (float)sc[h + 6];
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[n + l] = s1 * (float)q1;
                y[n + l + 32] = s2 * (float)q2;
                y[n + l + 64] = s3 * (float)q3;
                y[n + l + 96] = s4 * (float)q4;
            }
        }
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* 32 halves / bfloat16s at a time: fixed trip counts and restrict let the compiler
 * vectorize at -O2. */
static void deq_f16_32(const uint8_t *restrict s, float *restrict y) {
    for (int j = 0; j < 32; j++)
        y[j] = rd_f16(s + 2 * j);
}

static void deq_bf16_32(const uint8_t *restrict s, float *restrict y) {
    for (int j = 0; j < 32; j++) {
        uint16_t h;
        memcpy(&h, s + 2 * j, 2);
        y[j] = md_bf16_to_fp32(h);
    }
}

static int check_n(int type, int64_t n, const char *what, md_err *e) {
    int bs = ggml_blck_size(type);
    if (n < 0 || (bs && n % bs))
        return md_errf(e, MD_EINVAL, "%s %s: %lld elements is not a multiple of the block of %d",
                       what, ggml_type_name(type), (long long)n, bs);
    return 0;
}

int ggml_dequantize(int type, const void *src, float *dst, int64_t n, md_err *e) {
    const uint8_t *s = src;
    void (*blk)(const uint8_t *, float *) = NULL;
    if (n < 0)
        return md_errf(e, MD_EINVAL, "dequantize: negative element count %lld", (long long)n);
    switch (type) {
    case GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case GGML_F16:
    case GGML_BF16: {
        void (*row)(const uint8_t *, float *) = type == GGML_F16 ? deq_f16_32 : deq_bf16_32;
        int64_t i = 0;
        for (; i + 32 <= n; i += 32)
            row(s + 2 * i, dst + i);
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = type == GGML_F16 ? md_fp16_to_fp32(h) : md_bf16_to_fp32(h);
        }
        return 0;
    }
    case GGML_Q4_0: blk = deq_q4_0; break;
    case GGML_Q4_1: blk = deq_q4_1; break;
    case GGML_Q8_0: blk = deq_q8_0; break;
    case GGML_Q4_K: blk = deq_q4_k; break;
    case GGML_Q6_K: blk = deq_q6_k; break;
    default:
        return md_errf(e, MD_EUNSUPP, "dequantizing %s (type %d) is not supported",
                       ggml_type_name(type) ? ggml_type_name(type) : "an unknown type", type);
    }
    if (check_n(type, n, "dequantize", e))
        return MD_EINVAL;
    int bs = ggml_blck_size(type);
    size_t ts = ggml_type_size(type);
    for (int64_t i = 0; i < n / bs; i++)
        blk(s + (size_t)i * ts, dst + i * bs);
    return 0;
}

/* Q8_0: d = max|x| / 127, q = round(x / d). */
static void quant_q8_0(const float *restrict x, uint8_t *restrict b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax; /* comparisons, not fmaxf: no libm call, NaN ignored */
    }
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr_f16(b, d);
    int8_t q[32];
    for (int j = 0; j < 32; j++) {
        /* roundf (half away from zero) without a libm call: |v| <= ~127, so truncation
         * is floor and v - t is exact */
        float v = x[j] * id, a = fabsf(v);
        a = a < 127.0f ? a : 127.0f; /* NaN -> 127: no undefined cast */
        int t = (int)a;
        t += a - (float)t >= 0.5f;
        q[j] = (int8_t)(v < 0 ? -t : t);
    }
    memcpy(b + 2, q, 32);
}

/* A 4-bit code from v: truncation after clamping to [0, 15] in float, so inf/NaN (NaN -> 0)
 * never reach an undefined float->int cast. */
static int clamp15(float v) {
    v = v > 0.0f ? v : 0.0f;
    return (int)(v < 15.0f ? v : 15.0f);
}

/* Q4_0: the value of largest magnitude maps to -8, d = that value / -8. */
static void quant_q4_0(const float *restrict x, uint8_t *restrict b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr_f16(b, d);
    for (int j = 0; j < 16; j++) {
        int q0 = clamp15(x[j] * id + 8.5f), q1 = clamp15(x[j + 16] * id + 8.5f);
        b[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Q4_1: min m, d = (max - min) / 15, q = round((x - m) / d). */
static void quant_q4_1(const float *restrict x, uint8_t *restrict b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    float d = (mx - mn) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    wr_f16(b, d);
    wr_f16(b + 2, mn);
    for (int j = 0; j < 16; j++) {
        int q0 = clamp15((x[j] - mn) * id + 0.5f), q1 = clamp15((x[j + 16] - mn) * id + 0.5f);
        b[4 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

int ggml_quantize(int type, const float *src, void *dst, int64_t n, md_err *e) {
    uint8_t *d = dst;
    void (*blk)(const float *, uint8_t *) = NULL;
    if (n < 0)
        return md_errf(e, MD_EINVAL, "quantize: negative element count %lld", (long long)n);
    switch (type) {
    case GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case GGML_F16:
        for (int64_t i = 0; i < n; i++)
            wr_f16(d + 2 * i, src[i]);
        return 0;
    case GGML_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = md_fp32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return 0;
    case GGML_Q4_0: blk = quant_q4_0; break;
    case GGML_Q4_1: blk = quant_q4_1; break;
    case GGML_Q8_0: blk = quant_q8_0; break;
    default:
        return md_errf(e, MD_EUNSUPP, "quantizing to %s (type %d) is not supported",
                       ggml_type_name(type) ? ggml_type_name(type) : "an unknown type", type);
    }
    if (check_n(type, n, "quantize", e))
        return MD_EINVAL;
    size_t ts = ggml_type_size(type);
    for (int64_t i = 0; i < n / 32; i++)
        blk(src + i * 32, d + (size_t)i * ts);
    return 0;
}
