/* vexp.h — private to kernels/cpu: e^x on a vector of floats, the one polynomial that
 * vec.c's softmax and activations and attn_tiled.c's online softmax share. vexp8 (AVX2+FMA,
 * 8 lanes) and vexp16 (AVX-512F, 16 lanes) give the same value per lane.
 *
 * Method: n = round(x / ln 2), r = x - n ln 2 in two steps (Cody-Waite), e^r by a degree-6
 * polynomial (relative error < 2e-7 on [-87, 88]), times 2^n.
 * Range: 0 below -87.3 (expf underflows to subnormals there; these are 0), +inf from about
 * 88.73 up (as expf overflows; the argument is clamped to 89 so that 2^n stays n <= 128 and the
 * product overflows), +inf for +inf, 0 for -inf.
 * NaN: a NaN argument gives NaN. max_ps/min_ps return their second operand when either is
 * NaN, so every clamp puts x second, and the underflow mask is false for NaN: a NaN from a
 * faulty kernel must reach the logits, where the engine refuses it, not become a softmax
 * weight of 0 or a finite activation.
 *
 * Include after <immintrin.h> on x86-64 only; each function carries its own target
 * attribute, so the including file needs no -m flags. */
#ifndef MEDLEY_KERNELS_CPU_VEXP_H
#define MEDLEY_KERNELS_CPU_VEXP_H

#include <immintrin.h>

#define VEXP_LO -87.3f
#define VEXP_HI 89.0f

/* e^r = 1 + r + r^2 (c0 r^5 + c1 r^4 + ... + c5) for |r| <= ln2 / 2 (Cephes' expf) */
static const float vexp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                   4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

__attribute__((target("avx2,fma"), always_inline)) static inline __m256 vexp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(VEXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(VEXP_HI), _mm256_max_ps(_mm256_set1_ps(VEXP_LO), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(vexp_poly[0]);
    for (int i = 1; i < 6; i++)
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vexp_poly[i]));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n, n in [-126, 128], in two factors so that neither exponent field overflows; a NaN
     * lane's n converts to INT_MIN, harmless: p is NaN already */
    __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1);
    __m256 f1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 f2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, f1), f2));
}

/* As vexp8; scalef takes 2^n whole (it overflows to +inf and keeps NaN by itself). */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline __m512 vexp16(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(VEXP_LO), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(VEXP_HI), _mm512_max_ps(_mm512_set1_ps(VEXP_LO), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(vexp_poly[0]);
    for (int i = 1; i < 6; i++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vexp_poly[i]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

#endif
