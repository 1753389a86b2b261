/* kv_f16.c — the KV cache in half precision on the CPU (half the memory and half the bytes
 * attention reads per position): rows converted from F32 with round-to-nearest-even, and one
 * query head's attention over F16 K/V rows in the paged cache — the same arithmetic in the
 * same order as cpu_attention_paged over the converted values (F32 accumulation), scalar and
 * AVX2+F16C, chosen by cpu_simd_level(); and the same for the query heads that share a KV
 * head (GQA) on AVX-512, each K/V row converted once for all of them in 512-bit registers, with
 * the same bits as one head at a time. Single-threaded, no allocation. */
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <stdint.h>

#include "common/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

static inline size_t slot_of(const int32_t *bt, int block_tokens, int p) {
    return (size_t)bt[p / block_tokens] * (size_t)block_tokens + (size_t)(p % block_tokens);
}

static void to_f16_scalar(uint16_t *dst, const float *src, int n) {
    for (int i = 0; i < n; i++)
        dst[i] = md_fp32_to_fp16(src[i]);
}

static void attention_f16_scalar(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                                 size_t stride, const int32_t *bt, int block_tokens, int p0,
                                 int npos, int hd, float scale, float *sc) {
    float m = -INFINITY;
    for (int p = p0; p < npos; p++) {
        const uint16_t *kr = k + slot_of(bt, block_tokens, p) * stride;
        float s = 0;
        for (int i = 0; i < hd; i++)
            s += q[i] * md_fp16_to_fp32(kr[i]);
        sc[p] = s * scale;
        m = sc[p] > m ? sc[p] : m;
    }
    double sum = 0;
    for (int p = p0; p < npos; p++) {
        sc[p] = expf(sc[p] - m);
        sum += sc[p];
    }
    float r = (float)(1.0 / sum);
    for (int p = p0; p < npos; p++)
        sc[p] *= r;
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int p = p0; p < npos; p++) {
        const uint16_t *vr = v + slot_of(bt, block_tokens, p) * stride;
        for (int i = 0; i < hd; i++)
            out[i] += sc[p] * md_fp16_to_fp32(vr[i]);
    }
}

#ifdef HAVE_X86
#define F16C __attribute__((target("avx2,fma,f16c")))

F16C static inline __m256 ld8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

F16C static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

F16C static void to_f16_avx2(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = md_fp32_to_fp16(src[i]);
}

/* sc[p0..npos) = softmax of the scores there, m their maximum: in scalar order (exact expf,
 * a double sum), shared by the one-head and the grouped kernels so both give the same bits. */
static void softmax_from(float *sc, int p0, int npos, float m) {
    double sum = 0;
    for (int p = p0; p < npos; p++) {
        sc[p] = expf(sc[p] - m);
        sum += sc[p];
    }
    float r = (float)(1.0 / sum);
    for (int p = p0; p < npos; p++)
        sc[p] *= r;
}

/* hd % 8 == 0. Scores and the softmax in scalar order (exact expf), K/V rows through F16C. */
F16C static void attention_f16_avx2(float *out, const float *q, const uint16_t *k,
                                    const uint16_t *v, size_t stride, const int32_t *bt,
                                    int block_tokens, int p0, int npos, int hd, float scale,
                                    float *sc) {
    float m = -INFINITY;
    for (int p = p0; p < npos; p++) {
        const uint16_t *kr = k + slot_of(bt, block_tokens, p) * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= hd; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(kr + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld8(kr + i + 8), a1);
        }
        if (i < hd)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(kr + i), a0);
        sc[p] = hsum8(_mm256_add_ps(a0, a1)) * scale;
        m = sc[p] > m ? sc[p] : m;
    }
    softmax_from(sc, p0, npos, m);
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int nv = (hd - c0 < 64 ? hd - c0 : 64) / 8;
        __m256 acc[8];
        for (int j = 0; j < 8; j++)
            acc[j] = _mm256_setzero_ps();
        for (int p = p0; p < npos; p++) {
            const uint16_t *vr = v + slot_of(bt, block_tokens, p) * stride + c0;
            __m256 w = _mm256_set1_ps(sc[p]);
            for (int j = 0; j < nv; j++)
                acc[j] = _mm256_fmadd_ps(w, ld8(vr + 8 * j), acc[j]);
        }
        for (int j = 0; j < nv; j++)
            _mm256_storeu_ps(out + c0 + 8 * j, acc[j]);
    }
}

#define X512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

X512 static INL __m512 ld16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Columns [c0, c0 + 16 NV) of the G heads' outputs: each element the sum over p in order of
 * sc_g[p] * v[p], from 0 (as attention_f16_avx2's V pass). */
X512 static INL void v_pass512(float *out, int G, int NV, const uint16_t *v, size_t stride,
                               const int32_t *bt, int block_tokens, int p0, int npos, int hd,
                               const float *sc, int c0) {
    __m512 acc[CPU_ATT_GROUP][4];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        #pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            acc[g][j] = _mm512_setzero_ps();
    for (int p = p0; p < npos; p++) {
        const uint16_t *vr = v + slot_of(bt, block_tokens, p) * stride + c0;
        __m512 vv[4];
        #pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            vv[j] = ld16(vr + 16 * j);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m512 w = _mm512_set1_ps(sc[(size_t)g * npos + p]);
            #pragma GCC unroll 4
            for (int j = 0; j < NV; j++)
                acc[g][j] = _mm512_fmadd_ps(w, vv[j], acc[g][j]);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        #pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(out + g * hd + c0 + 16 * j, acc[g][j]);
}

/* The G <= CPU_ATT_GROUP query heads that share one KV head, hd % 16 == 0: each K and V row
 * converted once for all of them. Per head, the same operations in the same order as
 * attention_f16_avx2: a 512-bit score accumulator holds its a0 (lanes 0..7) and a1 (8..15),
 * reduced as hsum8(a0 + a1); each output element a sum over p in order from 0. So the
 * results are the same bits. sc holds G rows of npos floats. */
X512 static INL void group512(float *out, const float *q, const int G, const uint16_t *k,
                              const uint16_t *v, size_t stride, const int32_t *bt,
                              int block_tokens, int p0, int npos, int hd, float scale, float *sc) {
    float m[CPU_ATT_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        m[g] = -INFINITY;
    for (int p = p0; p < npos; p++) {
        const uint16_t *kr = k + slot_of(bt, block_tokens, p) * stride;
        __m512 a[CPU_ATT_GROUP];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            a[g] = _mm512_setzero_ps();
        for (int i = 0; i < hd; i += 16) {
            __m512 kv = ld16(kr + i);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++)
                a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + i), kv, a[g]);
        }
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m256 lo = _mm512_castps512_ps256(a[g]), hi = _mm512_extractf32x8_ps(a[g], 1);
            float s = hsum8(_mm256_add_ps(lo, hi)) * scale;
            sc[(size_t)g * npos + p] = s;
            m[g] = s > m[g] ? s : m[g];
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        softmax_from(sc + (size_t)g * npos, p0, npos, m[g]);
    int c0 = 0;
    for (; c0 + 64 <= hd; c0 += 64)
        v_pass512(out, G, 4, v, stride, bt, block_tokens, p0, npos, hd, sc, c0);
    for (; c0 < hd; c0 += 16)
        v_pass512(out, G, 1, v, stride, bt, block_tokens, p0, npos, hd, sc, c0);
}

X512 static void attention_f16_group_avx512(float *out, const float *q, int G, const uint16_t *k,
                                            const uint16_t *v, size_t stride, const int32_t *bt,
                                            int block_tokens, int p0, int npos, int hd,
                                            float scale, float *sc) {
    switch (G) {
    case 1: group512(out, q, 1, k, v, stride, bt, block_tokens, p0, npos, hd, scale, sc); break;
    case 2: group512(out, q, 2, k, v, stride, bt, block_tokens, p0, npos, hd, scale, sc); break;
    case 3: group512(out, q, 3, k, v, stride, bt, block_tokens, p0, npos, hd, scale, sc); break;
    default: group512(out, q, 4, k, v, stride, bt, block_tokens, p0, npos, hd, scale, sc); break;
    }
}
#define USE_F16C (cpu_simd_level() >= CPU_SIMD_AVX2)
#else
#define USE_F16C 0
#endif

void cpu_f32_to_f16_row(uint16_t *dst, const float *src, int n) {
#ifdef HAVE_X86
    if (USE_F16C) {
        to_f16_avx2(dst, src, n);
        return;
    }
#endif
    to_f16_scalar(dst, src, n);
}

void cpu_attention_paged_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                             size_t row_stride, const int32_t *block_table, int block_tokens,
                             int p0, int npos, int hd, float scale, float *scratch) {
    if (npos <= p0 || hd <= 0) {
        for (int i = 0; i < hd; i++)
            out[i] = 0;
        return;
    }
#ifdef HAVE_X86
    if (USE_F16C && hd % 8 == 0) {
        attention_f16_avx2(out, q, k, v, row_stride, block_table, block_tokens, p0, npos, hd, scale,
                           scratch);
        return;
    }
#endif
    attention_f16_scalar(out, q, k, v, row_stride, block_table, block_tokens, p0, npos, hd, scale,
                         scratch);
}

void cpu_attention_paged_f16_group(float *out, const float *q, int n_q, const uint16_t *k,
                                   const uint16_t *v, size_t row_stride,
                                   const int32_t *block_table, int block_tokens, int p0, int npos,
                                   int hd, float scale, float *scratch) {
#ifdef HAVE_X86
    if (cpu_simd_level() >= CPU_SIMD_AVX512VNNI && hd % 16 == 0 && npos > p0 && n_q >= 1 &&
        n_q <= CPU_ATT_GROUP) {
        attention_f16_group_avx512(out, q, n_q, k, v, row_stride, block_table, block_tokens, p0,
                                   npos, hd, scale, scratch);
        return;
    }
#endif
    for (int g = 0; g < n_q; g++)
        cpu_attention_paged_f16(out + (size_t)g * hd, q + (size_t)g * hd, k, v, row_stride,
                                block_table, block_tokens, p0, npos, hd, scale, scratch);
}
