/* repack_k_avx512.c — AVX-512 VNNI tiles of repacked Q4_K, Q5_K and Q6_K weights (repack_k.c's
 * layout): 16 rows in the 16 int32 lanes, up to KCP activation rows per call.
 *
 * Per super-block and activation row c, with each sub-block's dot an exact int32 sum of
 * dpbusd against 4 activation bytes broadcast to every lane (one load of x feeds 16 rows):
 *   Q4_K  m = Σ_s dpwssd((mn_s, mn_s), (bsum_2s, bsum_2s+1));  acc_c += cvt(m)·(−dmin·dx_c)
 *         sumi = Σ_s dot_s·sc_s (vpmulld by the 16 rows' scales);  acc_c += cvt(sumi)·(d·dx_c)
 *   Q5_K  Q4_K's, the fifth bits ORed into the nibbles (q <= 31) before the dots
 *   Q6_K  sumi = Σ_p dpwssd(−32·(sc_2p, sc_2p+1), (bsum_2p, bsum_2p+1)) + Σ_j dot_j·sc_j;
 *         acc_c += cvt(sumi)·(d·dx_c)
 * The integer sums are exact, so each lane's float sequence is the scalar reference's
 * (cpu_ptile_q4_k_scalar) whatever C, the tile or the thread. The weight vectors of a
 * sub-block are unpacked once per call and used by every activation row of the tile. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

TGT static INL __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

TGT static INL __m512 load_h16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* The 16 accumulators (rows) of activation rows 0..C-1 into y: stored, or added to y. */
TGT static INL void store_tile(const __m512 *acc, int C, int nr, float *y, size_t ldy, int add) {
    __mmask16 m = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    #pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        float *yc = y + (size_t)c * ldy;
        __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yc), acc[c]) : acc[c];
        _mm512_mask_storeu_ps(yc, m, v);
    }
}

/* Decode-sized tiles wait on memory: the next record is prefetched. */
TGT static INL void prefetch_next(const uint8_t *rec, size_t pb) {
    for (size_t o = 0; o < pb; o += 64)
        _mm_prefetch((const char *)rec + pb + o, _MM_HINT_T0);
}

/* Q5_K (five) byte g of wq: bit g of each fifth-bit byte moved to bit 4. 16-bit shifts: what
 * crosses from the other byte of the lane lands below bit 4 (left shifts by 4 - g) or above
 * it (right shifts by g - 4), never on it. */
TGT static INL __m512i fifth_bit(__m512i hb, const int g) {
    const __m512i m10 = _mm512_set1_epi8(0x10);
    __m512i v = g < 4 ? _mm512_slli_epi16(hb, 4 - g) : g > 4 ? _mm512_srli_epi16(hb, g - 4) : hb;
    return _mm512_and_si512(v, m10);
}

TGT static INL void pk_q4k(int nb, const uint8_t *wg, const int five, int nr, const act_row *a,
                           const int C, float *y, size_t ldy, int add) {
    const size_t pb = five ? PK_Q5K_BYTES : PK_Q4K_BYTES;
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc[KCP];
    __m512i sumi[KCP];
    #pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * pb;
        if (C <= 4)
            prefetch_next(rec, pb);
        __m512 dw = load_h16(rec + PK_Q4K_D);
        __m512 nmw = _mm512_sub_ps(_mm512_setzero_ps(), load_h16(rec + PK_Q4K_D + 32));
        __m512i mnp[8]; /* (mn_s, mn_s) int16 pairs of the 16 rows */
        #pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m512i mn =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + PK_Q4K_MN + 16 * s)));
            mnp[s] = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));
        }
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const int16_t *bs = a[c].bsum + (size_t)b * 16;
            __m512i m = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int s = 0; s < 8; s++)
                m = _mm512_dpwssd_epi32(m, mnp[s], bcast32(bs + 2 * s));
            __m512 dx = _mm512_set1_ps(a[c].d[b]);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(nmw, dx), acc[c]);
            sumi[c] = _mm512_setzero_si512();
        }
        for (int s = 0; s < 8; s++) {
            __m512i wq[8];
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i z = _mm512_loadu_si512((const void *)(rec + 256 * s + 64 * k));
                wq[2 * k] = _mm512_and_si512(z, m4);
                wq[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            }
            if (five) {
                __m512i hb = _mm512_loadu_si512((const void *)(rec + PK_Q5K_QH + 64 * s));
                #pragma GCC unroll 8
                for (int g = 0; g < 8; g++)
                    wq[g] = _mm512_or_si512(wq[g], fifth_bit(hb, g));
            }
            __m512i sc =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + PK_Q4K_SC + 16 * s)));
            #pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const int8_t *xq = a[c].q + (size_t)b * QK_K + 32 * s;
                __m512i d0 = _mm512_setzero_si512();
                #pragma GCC unroll 8
                for (int g = 0; g < 8; g++)
                    d0 = _mm512_dpbusd_epi32(d0, wq[g], bcast32(xq + 4 * g));
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(d0, sc));
            }
        }
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[c]),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(a[c].d[b])), acc[c]);
    }
    store_tile(acc, C, nr, y, ldy, add);
}

TGT static INL void pk_q6k(int nb, const uint8_t *wg, int nr, const act_row *a, const int C,
                           float *y, size_t ldy, int add) {
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[KCP];
    __m512i sumi[KCP];
    #pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * PK_Q6K_BYTES;
        if (C <= 4)
            prefetch_next(rec, PK_Q6K_BYTES);
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            sumi[c] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            /* the 16 rows' (sc_2p, sc_2p+1) as int16 pairs in the int32 lanes */
            __m512i sp = _mm512_cvtepi8_epi16(
                _mm256_loadu_si256((const __m256i *)(rec + PK_Q6K_SC + 32 * p)));
            __m512i nsp = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(sp, 5));
            #pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                sumi[c] =
                    _mm512_dpwssd_epi32(sumi[c], nsp, bcast32(a[c].bsum + (size_t)b * 16 + 2 * p));
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                int j = 2 * p + h;
                __m512i sc = h ? _mm512_srai_epi32(sp, 16)
                               : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
                const uint8_t *lo = rec + 256 * p + 128 * h;
                __m512i p0 = _mm512_loadu_si512((const void *)lo);
                __m512i p1 = _mm512_loadu_si512((const void *)(lo + 64));
                __m512i hb = _mm512_loadu_si512((const void *)(rec + PK_Q6K_QH + 64 * j));
                __m512i wq[4];
                wq[0] = _mm512_or_si512(_mm512_and_si512(p0, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
                wq[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p0, 4), m4),
                                        _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
                wq[2] = _mm512_or_si512(_mm512_and_si512(p1, m4), _mm512_and_si512(hb, m30));
                wq[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p1, 4), m4),
                                        _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
                #pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    const int8_t *xq = a[c].q + (size_t)b * QK_K + 16 * j;
                    __m512i d0 = _mm512_setzero_si512();
                    #pragma GCC unroll 4
                    for (int g = 0; g < 4; g++)
                        d0 = _mm512_dpbusd_epi32(d0, wq[g], bcast32(xq + 4 * g));
                    sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(d0, sc));
                }
            }
        }
        __m512 dw = load_h16(rec + PK_Q6K_D);
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[c]),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(a[c].d[b])), acc[c]);
    }
    store_tile(acc, C, nr, y, ldy, add);
}

#define DISPATCH8(CALL)                                                                            \
    switch (nc) {                                                                                  \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    case 5: CALL(5); break;                                                                        \
    case 6: CALL(6); break;                                                                        \
    case 7: CALL(7); break;                                                                        \
    default: CALL(8); break;                                                                       \
    }

TGT void cpu_ptile_q4_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc,
                               float *y, size_t ldy, int add) {
    _Static_assert(KCP == 8, "DISPATCH8 instantiates C = 1..KCP");
#define CALL4(C) pk_q4k(nb, wg, 0, nr, a, C, y, ldy, add)
    DISPATCH8(CALL4)
#undef CALL4
}

TGT void cpu_ptile_q5_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc,
                               float *y, size_t ldy, int add) {
#define CALL5(C) pk_q4k(nb, wg, 1, nr, a, C, y, ldy, add)
    DISPATCH8(CALL5)
#undef CALL5
}

TGT void cpu_ptile_q6_k_avx512(int nb, const uint8_t *wg, int nr, const act_row *a, int nc,
                               float *y, size_t ldy, int add) {
#define CALL6(C) pk_q6k(nb, wg, nr, a, C, y, ldy, add)
    DISPATCH8(CALL6)
#undef CALL6
}
#endif
