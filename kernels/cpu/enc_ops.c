/* enc_ops.c — the CPU math of encoder models (BERT): LayerNorm with bias, and one head's
 * bidirectional attention over one packed sequence (K transposed once per sequence, so the
 * scores of 32 keys are one pass of FMAs without horizontal sums; AVX2 and portable). The exact
 * GELU is vec.c's (cpu_gelu_erf). tests/unit/test_enc_ops.c checks each against a double
 * precision reference. No allocation: scratch is the caller's. */
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/cpu_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* The same three passes 16 lanes at a time (masked tail): lane sums, then one reduction. */
__attribute__((target("avx512f"))) static void layernorm512(float *out, const float *x,
                                                            const float *w, const float *b, int n,
                                                            float eps) {
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, x + i));
    }
    __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(s) / (float)n), v = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), mean);
        v = _mm512_fmadd_ps(d, d, v);
    }
    __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(v) / (float)n + eps));
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mean), inv);
        __m512 o = _mm512_add_ps(_mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, w + i)),
                                 _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(out + i, m, o);
    }
}
#endif

void cpu_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
#if defined(__x86_64__)
    if (cpu_simd_level() >= CPU_SIMD_AVX512VNNI) {
        layernorm512(out, x, w, b, n, eps);
        return;
    }
#endif
    float mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) {
        float d = x[i] - mean;
        var += d * d;
    }
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int i = 0; i < n; i++)
        out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* ---- one (sequence, head): K transposed once, then every query of the sequence ---- */

static void scores_scalar(float *s, const float *q, const float *kt, int n, int hd, float scale) {
    for (int j = 0; j < n; j++)
        s[j] = 0;
    for (int d = 0; d < hd; d++)
        for (int j = 0; j < n; j++)
            s[j] += q[d] * kt[(size_t)d * n + j];
    for (int j = 0; j < n; j++)
        s[j] *= scale;
}

static void weighted_scalar(float *out, const float *p, const float *v, size_t stride, int n,
                            int hd) {
    for (int d = 0; d < hd; d++)
        out[d] = 0;
    for (int j = 0; j < n; j++)
        for (int d = 0; d < hd; d++)
            out[d] += p[j] * v[(size_t)j * stride + d];
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

/* s [n] = scale · q·kt[., j]: 32 keys per pass in four accumulators (no horizontal sums). */
AVX2 static void scores_avx2(float *s, const float *q, const float *kt, int n, int hd,
                             float scale) {
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d++) {
            __m256 qd = _mm256_set1_ps(q[d]);
            const float *k = kt + (size_t)d * n + j;
            a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k), a0);
            a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 8), a1);
            a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 16), a2);
            a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 24), a3);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, sc));
        _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(a1, sc));
        _mm256_storeu_ps(s + j + 16, _mm256_mul_ps(a2, sc));
        _mm256_storeu_ps(s + j + 24, _mm256_mul_ps(a3, sc));
    }
    for (; j + 8 <= n; j += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(kt + (size_t)d * n + j), a);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(a, _mm256_set1_ps(scale)));
    }
    for (; j < n; j++) {
        float a = 0;
        for (int d = 0; d < hd; d++)
            a += q[d] * kt[(size_t)d * n + j];
        s[j] = a * scale;
    }
}

/* out [hd] = Σ_j p[j] v_j, hd a multiple of 8: 32 dimensions per pass, two keys per
 * iteration into two sets of accumulators (the FMA chains of one set would wait on latency). */
AVX2 static void weighted_avx2(float *out, const float *p, const float *v, size_t stride, int n,
                               int hd) {
    for (int c0 = 0; c0 < hd; c0 += 32) {
        int nv = (hd - c0 < 32 ? hd - c0 : 32) / 8;
        __m256 a[4], b[4];
        for (int r = 0; r < 4; r++)
            a[r] = b[r] = _mm256_setzero_ps();
        int j = 0;
        for (; j + 2 <= n; j += 2) {
            const float *v0 = v + (size_t)j * stride + c0, *v1 = v0 + stride;
            __m256 w0 = _mm256_set1_ps(p[j]), w1 = _mm256_set1_ps(p[j + 1]);
            for (int r = 0; r < nv; r++) {
                a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8 * r), a[r]);
                b[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 8 * r), b[r]);
            }
        }
        if (j < n) {
            const float *v0 = v + (size_t)j * stride + c0;
            for (int r = 0; r < nv; r++)
                a[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v0 + 8 * r), a[r]);
        }
        for (int r = 0; r < nv; r++)
            _mm256_storeu_ps(out + c0 + 8 * r, _mm256_add_ps(a[r], b[r]));
    }
}
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2")))
#define INL inline __attribute__((always_inline))
#define QB 8 /* queries per block at the AVX-512 level */

/* s [R][np] = scale · q_i · kt[., j] for R queries (rows ldq apart) and every key j < np (np a
 * multiple of 16; keys past n are kt's zero padding): per d, two key vectors loaded and R
 * queries broadcast, 2R FMAs. */
TGT512 static INL void scores_blk(const int R, float *s, int np, const float *q, size_t ldq,
                                  const float *kt, int hd, float scale) {
    __m512 sc = _mm512_set1_ps(scale);
    int j = 0;
    for (; j + 32 <= np; j += 32) {
        __m512 a0[QB], a1[QB];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a0[i] = a1[i] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m512 k0 = _mm512_load_ps(kt + (size_t)d * np + j);
            __m512 k1 = _mm512_load_ps(kt + (size_t)d * np + j + 16);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m512 qi = _mm512_set1_ps(q[i * ldq + d]);
                a0[i] = _mm512_fmadd_ps(qi, k0, a0[i]);
                a1[i] = _mm512_fmadd_ps(qi, k1, a1[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_store_ps(s + (size_t)i * np + j, _mm512_mul_ps(a0[i], sc));
            _mm512_store_ps(s + (size_t)i * np + j + 16, _mm512_mul_ps(a1[i], sc));
        }
    }
    if (j < np) { /* 16 keys left */
        __m512 a0[QB];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a0[i] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m512 k0 = _mm512_load_ps(kt + (size_t)d * np + j);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * ldq + d]), k0, a0[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            _mm512_store_ps(s + (size_t)i * np + j, _mm512_mul_ps(a0[i], sc));
    }
}

/* out rows [R] (ldo apart) = Σ_j p[i][j] v_j over n keys, hd a multiple of 16: 32 dimensions
 * at a time, R queries' weights broadcast per key. */
TGT512 static INL void weighted_blk(const int R, float *out, size_t ldo, const float *p, int np,
                                    const float *v, size_t stride, int n, int hd) {
    for (int c0 = 0; c0 < hd; c0 += 32) {
        __m512 a0[QB], a1[QB];
        int two = hd - c0 >= 32;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a0[i] = a1[i] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * stride + c0;
            __m512 v0 = _mm512_loadu_ps(vj), v1 = two ? _mm512_loadu_ps(vj + 16) : v0;
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m512 pi = _mm512_set1_ps(p[(size_t)i * np + j]);
                a0[i] = _mm512_fmadd_ps(pi, v0, a0[i]);
                a1[i] = _mm512_fmadd_ps(pi, v1, a1[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_storeu_ps(out + i * ldo + c0, a0[i]);
            if (two)
                _mm512_storeu_ps(out + i * ldo + c0 + 16, a1[i]);
        }
    }
}

TGT512 static void block512(int r, float *s, int np, const float *q, float *out, size_t ldq,
                            const float *kt, const float *v, int n, int hd, float scale) {
#define CALL(R)                                                                                    \
    scores_blk(R, s, np, q, ldq, kt, hd, scale);                                                   \
    for (int i = 0; i < R; i++)                                                                    \
        cpu_softmax(s + (size_t)i * np, n);                                                        \
    weighted_blk(R, out, ldq, s, np, v, ldq, n, hd)
    switch (r) {
    case 1: CALL(1); break;
    case 2: CALL(2); break;
    case 3: CALL(3); break;
    case 4: CALL(4); break;
    case 5: CALL(5); break;
    case 6: CALL(6); break;
    case 7: CALL(7); break;
    default: CALL(8); break;
    }
#undef CALL
}

/* One (sequence, head) at the AVX-512 level: K transposed into kt [hd][np] (zero-padded to a
 * multiple of 16 keys), then blocks of QB queries. */
TGT512 static void attention_seq512(float *out, const float *q, const float *k, const float *v,
                                    size_t row_stride, int n, int hd, float scale, float *scratch) {
    int np = (n + 15) & ~15;
    float *kt = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), *s = kt + (size_t)hd * np;
    for (int d = 0; d < hd; d++) {
        for (int j = 0; j < n; j++)
            kt[(size_t)d * np + j] = k[(size_t)j * row_stride + d];
        for (int j = n; j < np; j++)
            kt[(size_t)d * np + j] = 0;
    }
    for (int t = 0; t < n; t += QB)
        block512(n - t < QB ? n - t : QB, s, np, q + (size_t)t * row_stride, out + (size_t)t * row_stride,
                 row_stride, kt, v, n, hd, scale);
}
#define USE_AVX2 (cpu_simd_level() >= CPU_SIMD_AVX2)
#else
#define USE_AVX2 0
#endif

size_t cpu_attention_seq_scratch(int n, int hd) {
    return (size_t)(hd + 8) * (size_t)((n + 15) & ~15) + 16;
}

void cpu_attention_seq(float *out, const float *q, const float *k, const float *v,
                       size_t row_stride, int n, int hd, float scale, float *scratch) {
#if defined(__x86_64__)
    if (cpu_simd_level() >= CPU_SIMD_AVX512VNNI && hd % 16 == 0) {
        attention_seq512(out, q, k, v, row_stride, n, hd, scale, scratch);
        return;
    }
#endif
    float *kt = scratch, *s = scratch + (size_t)hd * n; /* kt [hd, n], s [n] */
    for (int j = 0; j < n; j++)
        for (int d = 0; d < hd; d++)
            kt[(size_t)d * n + j] = k[(size_t)j * row_stride + d];
    int simd = USE_AVX2 && hd % 8 == 0;
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * row_stride;
        float *ot = out + (size_t)t * row_stride;
#if defined(__x86_64__)
        if (simd) {
            scores_avx2(s, qt, kt, n, hd, scale);
            cpu_softmax(s, n);
            weighted_avx2(ot, s, v, row_stride, n, hd);
            continue;
        }
#endif
        scores_scalar(s, qt, kt, n, hd, scale);
        cpu_softmax(s, n);
        weighted_scalar(ot, s, v, row_stride, n, hd);
    }
    (void)simd;
}
