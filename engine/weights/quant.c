/* quant.c — see quant.h: dequantization of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K,
 * Q6_K, Q5_0's lossless recoding as Q8_0, and
 * quantization to F32, F16, BF16, Q8_0, Q4_0, Q4_1, the plain scalar definitions of each
 * block format (layouts in common/dtype.h) that the fast kernels in kernels/ are checked
 * against. */
#include "engine/weights/quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* Q5_0's 5-bit value of element j (0..31): nibble j % 16 of qs (low for j < 16) and bit j of
 * the little-endian qh as the fifth bit. */
static int q5_0_q(const uint8_t *b, int j) {
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    int nib = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

static void deq_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(q5_0_q(b, j) - 16) * d;
}

int md_q5_0_to_q8_0(const void *src, void *dst, int64_t n, md_err *e) {
    if (n < 0 || n % 32)
        return md_errf(e, MD_EINVAL, "Q5_0 to Q8_0: %lld elements is not a multiple of 32",
                       (long long)n);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *b = (const uint8_t *)src + (size_t)i * 22;
        uint8_t *o = (uint8_t *)dst + (size_t)i * 34;
        memcpy(o, b, 2); /* the same f16 scale */
        for (int j = 0; j < 32; j++)
            o[2 + j] = (uint8_t)(int8_t)(q5_0_q(b, j) - 16);
    }
    return 0;
}

static void deq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++)
        y[j] = (float)qs[j] * d;
}

static void deq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        int sc, m;
        md_q4k_scale_min(scales, is, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        md_q4k_scale_min(scales, is + 1, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++)
            y[j + l] = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++)
            y[j + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
    }
}

/* Q5_K: Q4_K's layout with qh[32] between the scales and the nibbles; bit s of qh[l] is the
 * fifth bit of element l of sub-block s. */
static void deq_q5_k(const uint8_t *restrict b, float *restrict y) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *q = b + 48;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        int sc, m;
        md_q4k_scale_min(scales, is, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        md_q4k_scale_min(scales, is + 1, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++)
            y[j + l] = d1 * (float)((q[l] & 0x0f) | ((qh[l] >> is) & 1) << 4) - m1;
        for (int l = 0; l < 32; l++)
            y[j + 32 + l] = d2 * (float)((q[l] >> 4) | ((qh[l] >> (is + 1)) & 1) << 4) - m2;
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
    int bs = md_type_block(type);
    if (n < 0 || (bs && n % bs))
        return md_errf(e, MD_EINVAL, "%s %s: %lld elements is not a multiple of the block of %d",
                       what, md_type_name(type), (long long)n, bs);
    return 0;
}

int md_dequantize(int type, const void *src, float *dst, int64_t n, md_err *e) {
    const uint8_t *s = src;
    void (*blk)(const uint8_t *, float *) = NULL;
    if (n < 0)
        return md_errf(e, MD_EINVAL, "dequantize: negative element count %lld", (long long)n);
    switch (type) {
    case MD_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case MD_TYPE_F16:
    case MD_TYPE_BF16: {
        void (*row)(const uint8_t *, float *) = type == MD_TYPE_F16 ? deq_f16_32 : deq_bf16_32;
        int64_t i = 0;
        for (; i + 32 <= n; i += 32)
            row(s + 2 * i, dst + i);
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = type == MD_TYPE_F16 ? md_fp16_to_fp32(h) : md_bf16_to_fp32(h);
        }
        return 0;
    }
    case MD_TYPE_Q4_0: blk = deq_q4_0; break;
    case MD_TYPE_Q4_1: blk = deq_q4_1; break;
    case MD_TYPE_Q8_0: blk = deq_q8_0; break;
    case MD_TYPE_Q5_0: blk = deq_q5_0; break;
    case MD_TYPE_Q4_K: blk = deq_q4_k; break;
    case MD_TYPE_Q5_K: blk = deq_q5_k; break;
    case MD_TYPE_Q6_K: blk = deq_q6_k; break;
    default:
        return md_errf(e, MD_EUNSUPP, "dequantizing %s (type %d) is not supported",
                       md_type_name(type) ? md_type_name(type) : "an unknown type", type);
    }
    if (check_n(type, n, "dequantize", e))
        return MD_EINVAL;
    int bs = md_type_block(type);
    size_t ts = md_type_block_bytes(type);
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

int md_quantize(int type, const float *src, void *dst, int64_t n, md_err *e) {
    uint8_t *d = dst;
    void (*blk)(const float *, uint8_t *) = NULL;
    if (n < 0)
        return md_errf(e, MD_EINVAL, "quantize: negative element count %lld", (long long)n);
    switch (type) {
    case MD_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case MD_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            wr_f16(d + 2 * i, src[i]);
        return 0;
    case MD_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = md_fp32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return 0;
    case MD_TYPE_Q4_0: blk = quant_q4_0; break;
    case MD_TYPE_Q4_1: blk = quant_q4_1; break;
    case MD_TYPE_Q8_0: blk = quant_q8_0; break;
    default:
        return md_errf(e, MD_EUNSUPP, "quantizing to %s (type %d) is not supported",
                       md_type_name(type) ? md_type_name(type) : "an unknown type", type);
    }
    if (check_n(type, n, "quantize", e))
        return MD_EINVAL;
    size_t ts = md_type_block_bytes(type);
    for (int64_t i = 0; i < n / 32; i++)
        blk(src + i * 32, d + (size_t)i * ts);
    return 0;
}
