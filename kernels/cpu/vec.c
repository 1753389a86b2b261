/* vec.c — the forward pass's vector ops (rmsnorm, swiglu, exact GELU, add, dot, axpy, scale, softmax,
 * argmax, one query head's attention over a paged KV cache):
 * a portable scalar version of each and an AVX2+FMA version chosen at run time by
 * cpu_simd_level(). Single-threaded, no allocation. The AVX2 exp is vexp.h's vexp8 (a NaN
 * argument stays NaN, so a NaN input reaches the output of every op here). */
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#include "kernels/cpu/vexp.h"
#endif

/* ---- scalar ---- */

static void rmsnorm_scalar(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

static void swiglu_scalar(float *out, const float *g, const float *u, int n) {
    for (int i = 0; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void softmax_scalar(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float r = (float)(1.0 / s);
    for (int i = 0; i < n; i++)
        x[i] *= r;
}

/* The lowest index of the largest of x[0..n-1], -1 if any is NaN (the sampler's greedy rule). */
static int argmax_scalar(const float *x, int n) {
    int best = 0, nan = x[0] != x[0];
    for (int i = 1; i < n; i++) {
        nan |= x[i] != x[i];
        if (x[i] > x[best])
            best = i;
    }
    return nan ? -1 : best;
}

/* Row of position p in a paged cache. */
static inline size_t paged_slot(const int32_t *bt, int block_tokens, int p) {
    return (size_t)bt[p / block_tokens] * (size_t)block_tokens + (size_t)(p % block_tokens);
}

static void attention_scalar(float *out, const float *q, const float *k, const float *v,
                             size_t stride, const int32_t *bt, int block_tokens, int p0, int npos,
                             int hd, float scale, float *sc) {
    for (int p = p0; p < npos; p++)
        sc[p] = dot_scalar(q, k + paged_slot(bt, block_tokens, p) * stride, hd) * scale;
    softmax_scalar(sc + p0, npos - p0);
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int p = p0; p < npos; p++) {
        const float *vr = v + paged_slot(bt, block_tokens, p) * stride;
        for (int i = 0; i < hd; i++)
            out[i] += sc[p] * vr[i];
    }
}

#ifdef HAVE_X86
/* ---- AVX2 + FMA ---- */
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static void rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    double ss = hsum8(acc);
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = x[i] * r * w[i];
}

AVX2 static __m256 swiglu8(__m256 gv, __m256 uv) {
    __m256 e = vexp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), uv);
}

/* The tail goes through the same vector formula, so an element's value does not depend on
 * where a span starts (the fused gate/up product applies this to row ranges, the unfused op
 * to thread ranges; both must agree bit for bit). */
AVX2 static void swiglu_avx2(float *out, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0}, ob[8];
        memcpy(gb, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(ub, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(ob, swiglu8(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub)));
        memcpy(out + i, ob, (size_t)(n - i) * sizeof(float));
    }
}

/* gelu's tanh form as a sigmoid: 0.5 g (1 + tanh z) = g / (1 + e^(-2z)), z = sqrt(2/pi)
 * (g + 0.044715 g^3); e^(-2z) overflowing (z < -44) gives g / inf = -0, tanh's limit. */
AVX2 static __m256 geglu8(__m256 gv, __m256 uv) {
    __m256 g2 = _mm256_mul_ps(gv, gv);
    __m256 z2 = _mm256_mul_ps(_mm256_mul_ps(gv, _mm256_set1_ps(-1.5957691216057308f)),
                              _mm256_fmadd_ps(g2, _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f)));
    __m256 e = vexp8(z2);
    return _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), uv);
}

/* As swiglu_avx2: the tail through the same vector formula. */
AVX2 static void geglu_avx2(float *out, const float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, geglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0}, ob[8];
        memcpy(gb, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(ub, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(ob, geglu8(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub)));
        memcpy(out + i, ob, (size_t)(n - i) * sizeof(float));
    }
}

/* The exact GELU, 0.5 x (1 + erf(x / sqrt 2)), with erf(z) = 1 - erfc(z) for z >= 0 from
 * Numerical Recipes' erfcc Chebyshev fit (relative error of erfc < 1.2e-7 everywhere) and
 * vexp8; odd in z. */
AVX2 static __m256 gelu_erf8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    __m256 az = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(half, az, one));
    static const float c[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                              -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
    __m256 p = _mm256_set1_ps(c[0]);
    for (int i = 1; i < 10; i++)
        p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c[i]));
    __m256 arg = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_fnmadd_ps(az, az, p));
    __m256 erfc = _mm256_mul_ps(t, vexp8(arg));
    __m256 erf_abs = _mm256_sub_ps(one, erfc);
    __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(z, _mm256_set1_ps(-0.0f))); /* sign of z */
    return _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, erf));
}

AVX2 static void gelu_erf_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, gelu_erf8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

AVX2 static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

AVX2 static void softmax_avx2(float *x, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float m = _mm_cvtss_f32(m4);
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    mv = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    double s = hsum8(sv);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float r = (float)(1.0 / s);
    __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), rv));
    for (; i < n; i++)
        x[i] *= r;
}
/* hd a multiple of 8. Scores then softmax in scratch, then the weighted sum of V rows with
 * 64 output floats held in registers per pass. */
AVX2 static void attention_avx2(float *out, const float *q, const float *k, const float *v,
                                size_t stride, const int32_t *bt, int block_tokens, int p0,
                                int npos, int hd, float scale, float *sc) {
    for (int p = p0; p < npos; p++) {
        const float *kr = k + paged_slot(bt, block_tokens, p) * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= hd; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kr + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(kr + i + 8), a1);
        }
        if (i < hd)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kr + i), a0);
        sc[p] = hsum8(_mm256_add_ps(a0, a1)) * scale;
    }
    softmax_avx2(sc + p0, npos - p0);
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int nv = (hd - c0 < 64 ? hd - c0 : 64) / 8;
        __m256 acc[8];
        for (int r = 0; r < 8; r++)
            acc[r] = _mm256_setzero_ps();
        for (int p = p0; p < npos; p++) {
            const float *vr = v + paged_slot(bt, block_tokens, p) * stride + c0;
            __m256 w = _mm256_set1_ps(sc[p]);
            for (int r = 0; r < nv; r++)
                acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * r), acc[r]);
        }
        for (int r = 0; r < nv; r++)
            _mm256_storeu_ps(out + c0 + 8 * r, acc[r]);
    }
}
/* Two passes instead of a running (value, index) pair: the maximum and a NaN flag with
 * independent accumulators, then the first index equal to it (the row is in cache by then, and
 * the second pass stops at the match). The first x[i] == max is argmax_scalar's pick: a later
 * equal value (also +0 against -0) never replaces it there. */
AVX2 static int argmax_avx2(const float *x, int n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256 un = _mm256_setzero_ps(); /* lanes that met a NaN */
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
        un = _mm256_or_ps(
            un, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
        m0 = _mm256_max_ps(m0, a);
        m1 = _mm256_max_ps(m1, b);
        m2 = _mm256_max_ps(m2, c);
        m3 = _mm256_max_ps(m3, d);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        un = _mm256_or_ps(un, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, a);
    }
    if (_mm256_movemask_ps(un))
        return -1;
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, m0);
    for (int k = 0; k < 8; k++)
        mx = lanes[k] > mx ? lanes[k] : mx;
    for (int k = i; k < n; k++) {
        if (x[k] != x[k])
            return -1;
        mx = x[k] > mx ? x[k] : mx;
    }
    __m256 mv = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (hit)
            return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (x[i] == mx)
            return i;
    return 0; /* not reached: mx is one of x */
}
#define USE_AVX2 (cpu_simd_level() >= CPU_SIMD_AVX2)
#else
#define USE_AVX2 0
#endif

void cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
#ifdef HAVE_X86
    if (USE_AVX2) {
        rmsnorm_avx2(out, x, w, n, eps);
        return;
    }
#endif
    rmsnorm_scalar(out, x, w, n, eps);
}

void cpu_swiglu(float *out, const float *gate, const float *up, int n) {
#ifdef HAVE_X86
    if (USE_AVX2) {
        swiglu_avx2(out, gate, up, n);
        return;
    }
#endif
    swiglu_scalar(out, gate, up, n);
}

/* tanhf per element: the exact tanh form (llama.cpp's CPU backend reads gelu from a table of
 * F16 inputs; the two agree to ~1e-3 relative, well inside the 8-bit activation rounding of
 * the products around it). */
void cpu_geglu(float *out, const float *gate, const float *up, int n) {
#ifdef HAVE_X86
    /* the same formula through vexp8 (the tanhf/expm1f calls were 15% of a Gemma 3 prefill) */
    if (USE_AVX2) {
        geglu_avx2(out, gate, up, n);
        return;
    }
#endif
    const float c = 0.79788456080286535588f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

/* Element-wise ops the compiler vectorises well at the baseline level. */
void cpu_add(float *out, const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void cpu_gelu_erf(float *x, int n) {
#ifdef HAVE_X86
    if (USE_AVX2) {
        gelu_erf_avx2(x, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void cpu_scale(float *x, float a, int n) {
    for (int i = 0; i < n; i++)
        x[i] *= a;
}

float cpu_dot_f32(const float *a, const float *b, int n) {
#ifdef HAVE_X86
    if (USE_AVX2)
        return dot_avx2(a, b, n);
#endif
    return dot_scalar(a, b, n);
}

void cpu_axpy(float *y, float a, const float *x, int n) {
#ifdef HAVE_X86
    if (USE_AVX2) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

void cpu_softmax(float *x, int n) {
    if (n <= 0)
        return;
#ifdef HAVE_X86
    if (USE_AVX2) {
        softmax_avx2(x, n);
        return;
    }
#endif
    softmax_scalar(x, n);
}

void cpu_attention_paged(float *out, const float *q, const float *k, const float *v,
                         size_t row_stride, const int32_t *block_table, int block_tokens, int p0,
                         int npos, int hd, float scale, float *scratch) {
    if (npos <= p0 || hd <= 0) {
        for (int i = 0; i < hd; i++)
            out[i] = 0;
        return;
    }
#ifdef HAVE_X86
    if (USE_AVX2 && hd % 8 == 0) {
        attention_avx2(out, q, k, v, row_stride, block_table, block_tokens, p0, npos, hd, scale,
                       scratch);
        return;
    }
#endif
    attention_scalar(out, q, k, v, row_stride, block_table, block_tokens, p0, npos, hd, scale,
                     scratch);
}

int cpu_argmax_f32(const float *x, int n) {
    if (n <= 0)
        return -1;
#ifdef HAVE_X86
    if (USE_AVX2)
        return argmax_avx2(x, n);
#endif
    return argmax_scalar(x, n);
}
