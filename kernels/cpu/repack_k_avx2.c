/* repack_k_avx2.c — AVX2 tiles of repacked Q4_K, Q5_K and Q6_K weights (repack_k.c's layout): 8 rows
 * in the 8 int32 lanes (half h of a record: bytes 32h..32h+31 of each 64-byte part), pairs of
 * activation rows.
 *
 * maddubs of a part against 4 activation bytes broadcast to every lane gives each row's pairs
 * in int16; the sub-block scale is then the madd operand in place of ones, so it costs
 * nothing: per sub-block, madd(Σ_g maddubs(w_g, x_g), (sc, sc)) = sc·dot exactly (Q4_K: 8
 * groups of 2·15·127 < 2^15 summed in int16 first; Q5_K, its fifth bits ORed in: 4 groups of
 * 2·31·127; Q6_K: 2 groups of 2·63·127). The min
 * and −32 terms are madds of the scale or min pairs against the 16-element activation sums:
 *   Q4_K  acc_c += cvt(Σ_s mn_s·S_s)·(−dmin·dx_c), then acc_c += cvt(Σ_s sc_s·dot_s)·(d·dx_c)
 *   Q6_K  acc_c += cvt(Σ_j sc_j·dot_j − 32·Σ_j sc_j·bsum_j)·(d·dx_c)
 * the scalar reference's sequence per lane (cpu_ptile_q4_k_scalar), exact integer sums. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

TGT static INL __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

TGT static INL __m256 load_h8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Q5_K (five) byte g of wq: bit g of each fifth-bit byte moved to bit 4 (16-bit shifts: what
 * crosses from the lane's other byte lands below or above bit 4, never on it). */
TGT static INL __m256i fifth_bit(__m256i hb, const int g) {
    const __m256i m10 = _mm256_set1_epi8(0x10);
    __m256i v = g < 4 ? _mm256_slli_epi16(hb, 4 - g) : g > 4 ? _mm256_srli_epi16(hb, g - 4) : hb;
    return _mm256_and_si256(v, m10);
}

TGT static INL void q4k_main(int nb, const uint8_t *wg, const int five, int h, const act_row *a,
                             const int C, __m256 acc[2]) {
    const size_t pb = five ? PK_Q5K_BYTES : PK_Q4K_BYTES;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i sumi[2];
    for (int c = 0; c < C; c++)
        acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * pb;
        __m256 dw = load_h8(rec + PK_Q4K_D + 16 * h);
        __m256 nmw = _mm256_sub_ps(_mm256_setzero_ps(), load_h8(rec + PK_Q4K_D + 32 + 16 * h));
        for (int c = 0; c < C; c++) {
            const int16_t *bs = a[c].bsum + (size_t)b * 16;
            __m256i m = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                __m256i mn = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(rec + PK_Q4K_MN + 16 * s + 8 * h)));
                mn = _mm256_or_si256(mn, _mm256_slli_epi32(mn, 16)); /* (mn, mn) pairs */
                m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, bcast32(bs + 2 * s)));
            }
            __m256 dx = _mm256_set1_ps(a[c].d[b]);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(nmw, dx), acc[c]);
            sumi[c] = _mm256_setzero_si256();
        }
        for (int s = 0; s < 8; s++) {
            __m256i wq[8];
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i z = _mm256_loadu_si256((const __m256i *)(rec + 256 * s + 64 * k + 32 * h));
                wq[2 * k] = _mm256_and_si256(z, m4);
                wq[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
            }
            if (five) {
                __m256i hb =
                    _mm256_loadu_si256((const __m256i *)(rec + PK_Q5K_QH + 64 * s + 32 * h));
                #pragma GCC unroll 8
                for (int g = 0; g < 8; g++)
                    wq[g] = _mm256_or_si256(wq[g], fifth_bit(hb, g));
            }
            __m256i sc = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(rec + PK_Q4K_SC + 16 * s + 8 * h)));
            sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)); /* (sc, sc) int16 pairs */
            #pragma GCC unroll 2
            for (int c = 0; c < C; c++) {
                const int8_t *xq = a[c].q + (size_t)b * QK_K + 32 * s;
                if (five) { /* 2·31·127 per group: int16 holds the sum of 4, not of 8 */
                    __m256i pa = _mm256_maddubs_epi16(wq[0], bcast32(xq));
                    __m256i pb4 = _mm256_maddubs_epi16(wq[4], bcast32(xq + 16));
                    #pragma GCC unroll 3
                    for (int g = 1; g < 4; g++) {
                        pa = _mm256_add_epi16(pa, _mm256_maddubs_epi16(wq[g], bcast32(xq + 4 * g)));
                        pb4 = _mm256_add_epi16(
                            pb4, _mm256_maddubs_epi16(wq[g + 4], bcast32(xq + 16 + 4 * g)));
                    }
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(pa, sc),
                                                                         _mm256_madd_epi16(pb4, sc)));
                    continue;
                }
                __m256i p16 = _mm256_maddubs_epi16(wq[0], bcast32(xq));
                #pragma GCC unroll 7
                for (int g = 1; g < 8; g++)
                    p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(wq[g], bcast32(xq + 4 * g)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p16, sc));
            }
        }
        for (int c = 0; c < C; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(a[c].d[b])), acc[c]);
    }
}

TGT static INL void q6k_main(int nb, const uint8_t *wg, int h, const act_row *a, const int C,
                             __m256 acc[2]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    /* (sc_2p, sc_2p) and (sc_2p+1, sc_2p+1) from the (sc_2p, sc_2p+1) int16 pairs */
    const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1,
                                          0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    const __m256i odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
    __m256i sumi[2];
    for (int c = 0; c < C; c++)
        acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * PK_Q6K_BYTES;
        for (int c = 0; c < C; c++)
            sumi[c] = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++) {
            __m256i sp = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(rec + PK_Q6K_SC + 32 * p + 16 * h)));
            __m256i sp32 = _mm256_slli_epi16(sp, 5);
            for (int c = 0; c < C; c++)
                sumi[c] = _mm256_sub_epi32(
                    sumi[c], _mm256_madd_epi16(sp32, bcast32(a[c].bsum + (size_t)b * 16 + 2 * p)));
            #pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                int j = 2 * p + hh;
                __m256i sc = _mm256_shuffle_epi8(sp, hh ? odd : even);
                const uint8_t *lo = rec + 256 * p + 128 * hh + 32 * h;
                __m256i p0 = _mm256_loadu_si256((const __m256i *)lo);
                __m256i p1 = _mm256_loadu_si256((const __m256i *)(lo + 64));
                __m256i hb =
                    _mm256_loadu_si256((const __m256i *)(rec + PK_Q6K_QH + 64 * j + 32 * h));
                __m256i w0 = _mm256_or_si256(_mm256_and_si256(p0, m4),
                                             _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
                __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p0, 4), m4),
                                             _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
                __m256i w2 = _mm256_or_si256(_mm256_and_si256(p1, m4), _mm256_and_si256(hb, m30));
                __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p1, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
                #pragma GCC unroll 2
                for (int c = 0; c < C; c++) {
                    const int8_t *xq = a[c].q + (size_t)b * QK_K + 16 * j;
                    __m256i pa = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast32(xq)),
                                                  _mm256_maddubs_epi16(w1, bcast32(xq + 4)));
                    __m256i pb = _mm256_add_epi16(_mm256_maddubs_epi16(w2, bcast32(xq + 8)),
                                                  _mm256_maddubs_epi16(w3, bcast32(xq + 12)));
                    sumi[c] =
                        _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(pa, sc),
                                                                   _mm256_madd_epi16(pb, sc)));
                }
            }
        }
        __m256 dw = load_h8(rec + PK_Q6K_D + 16 * h);
        for (int c = 0; c < C; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[c]),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(a[c].d[b])), acc[c]);
    }
}

/* Rows [0, nr) of a packed group against a[0..nc): halves of 8 rows × pairs of activation
 * rows. */
TGT static INL void k2_tile(int q6, int five, int nb, const uint8_t *wg, int nr, const act_row *a,
                            int nc, float *y, size_t ldy, int add) {
    for (int h = 0; h < 2 && 8 * h < nr; h++) {
        int n8 = nr - 8 * h < 8 ? nr - 8 * h : 8;
        __m256i m =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int c = 0; c < nc; c += 2) {
            __m256 acc[2];
            int C = nc - c < 2 ? 1 : 2;
            /* C a constant in each call: the accumulators stay in registers */
            if (q6 && C == 2)
                q6k_main(nb, wg, h, a + c, 2, acc);
            else if (q6)
                q6k_main(nb, wg, h, a + c, 1, acc);
            else if (five && C == 2)
                q4k_main(nb, wg, 1, h, a + c, 2, acc);
            else if (five)
                q4k_main(nb, wg, 1, h, a + c, 1, acc);
            else if (C == 2)
                q4k_main(nb, wg, 0, h, a + c, 2, acc);
            else
                q4k_main(nb, wg, 0, h, a + c, 1, acc);
            for (int k = 0; k < C; k++) {
                float *yc = y + (size_t)(c + k) * ldy + 8 * h;
                __m256 v = add ? _mm256_add_ps(_mm256_maskload_ps(yc, m), acc[k]) : acc[k];
                _mm256_maskstore_ps(yc, m, v);
            }
        }
    }
}

TGT void cpu_ptile_q4_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                             size_t ldy, int add) {
    k2_tile(0, 0, nb, wg, nr, a, nc, y, ldy, add);
}

TGT void cpu_ptile_q5_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                             size_t ldy, int add) {
    k2_tile(0, 1, nb, wg, nr, a, nc, y, ldy, add);
}

TGT void cpu_ptile_q6_k_avx2(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,
                             size_t ldy, int add) {
    k2_tile(1, 0, nb, wg, nr, a, nc, y, ldy, add);
}
#endif
