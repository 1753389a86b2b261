/* matmul_avx512.c — AVX-512 VNNI tile kernels for every weight type: the 32-element block
 * types (Q4_0, Q4_1, Q5_0, Q8_0), the K-quants (Q4_K, Q5_K, Q6_K: maddubs then dpwssd with the
 * sub-block scales) and float weights.
 *
 * Two blocks per 512-bit register: int32 lanes 0..7 hold block b's partial dot, lanes 8..15
 * block b+1's, so the scale vector is (dw_b·dx_b ×8, dw_b+1·dx_b+1 ×8). _mm512_dpbusd_epi32
 * multiplies u8 weights by s8 activations and sums groups of 4 into int32 in one
 * instruction. Tiles are 4 weight rows × 4 activation rows (16 accumulators of 32
 * registers). Q8_0 weights are made unsigned by adding 128 (xor 0x80); the -128·Σx term,
 * like Q4_0's -8·Σx and Q4_1's min·Σx, is folded in per block from s = dx·Σqx. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

TGT static INL float h2f(uint16_t h) { return _cvtsh_ss(h); }

TGT static INL __m512 pair(float lo, float hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)),
                                               _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
}

/* Nibbles of blocks b and b+1 (qs1 NULL: a zero block) as 64 u8 in element order. */
TGT static INL __m512i unpack2_q4(const uint8_t *qs0, const uint8_t *qs1) {
    __m128i v1 = qs1 ? _mm_loadu_si128((const __m128i *)qs1) : _mm_setzero_si128();
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)qs0)), v1, 1);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    z = _mm512_and_si512(z, _mm512_set1_epi8(15));
    /* [lo_b, lo_b1, hi_b, hi_b1] -> [lo_b, hi_b, lo_b1, hi_b1] */
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

TGT static INL __m512i load2_q8(const int8_t *q0, const int8_t *q1) {
    __m256i hi = q1 ? _mm256_loadu_si256((const __m256i *)q1) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q0)),
                              hi, 1);
}

TGT static INL float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

enum { K_Q4_0, K_Q4_1, K_Q8_0, K_Q5_0 };

/* Blocks b and b+1 (two = 1) or block b alone (two = 0) into the R×C accumulators. */
TGT static INL void blk32_pair(const uint8_t *w, size_t ws, size_t bsz, int qoff, int kind,
                               float sk, __m512i sel_d, __m512i sel_m, int b, const int two,
                               const int R, const act_row *a, const int C, __m512 acc[4][4]) {
    __m512i xq[4];
    __m512 dxv[4], sv[4];
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        xq[c] = load2_q8(a[c].q + b * QK32, two ? a[c].q + (b + 1) * QK32 : NULL);
        dxv[c] = pair(a[c].d[b], two ? a[c].d[b + 1] : 0.0f);
        sv[c] = pair(sk * a[c].s[b], two ? sk * a[c].s[b + 1] : 0.0f);
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *b0 = w + r * ws + (size_t)b * bsz, *b1 = b0 + bsz;
        /* Few activation rows (decode, small batches) are memory-bound: fetch the same
         * block three tiles ahead, since the hardware prefetcher alone left the loads
         * waiting on DRAM (with 16-64 rows it measured no slower). */
        _mm_prefetch((const char *)b0 + (size_t)3 * R * ws, _MM_HINT_T0);
        /* first 4 bytes of both blocks: d and (Q4_1) m as halves; for Q4_0/Q8_0 the
         * second half is quant bytes, converted but never selected */
        uint32_t dm0, dm1 = 0;
        memcpy(&dm0, b0, 4);
        if (two)
            memcpy(&dm1, b1, 4);
        __m512 f = _mm512_castps128_ps512(
            _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)dm1, (int)dm0))); /* d0 m0 d1 m1 */
        __m512 dwv = _mm512_permutexvar_ps(sel_d, f), mwv = dwv;
        if (kind == K_Q4_1)
            mwv = _mm512_permutexvar_ps(sel_m, f);
        __m512i wq;
        if (kind == K_Q8_0)
            wq = _mm512_xor_si512(load2_q8((const int8_t *)(b0 + qoff),
                                           two ? (const int8_t *)(b1 + qoff) : NULL),
                                  _mm512_set1_epi8((char)0x80));
        else
            wq = unpack2_q4(b0 + qoff, two ? b1 + qoff : NULL);
        if (kind == K_Q5_0) {
            /* fifth bits: bit j of qh is element j, and wq holds block b's 32 elements
             * then block b+1's, so the two qh words are the byte mask as they stand */
            uint32_t h0, h1 = 0;
            memcpy(&h0, b0 + 2, 4);
            if (two)
                memcpy(&h1, b1 + 2, 4);
            __mmask64 hm = (__mmask64)h0 | (__mmask64)h1 << 32;
            wq = _mm512_mask_add_epi8(wq, hm, wq, _mm512_set1_epi8(16));
        }
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq[c]));
            if (kind == K_Q4_1) {
                acc[r][c] = _mm512_fmadd_ps(p, _mm512_mul_ps(dwv, dxv[c]), acc[r][c]);
                acc[r][c] = _mm512_fmadd_ps(mwv, sv[c], acc[r][c]);
            } else {
                acc[r][c] = _mm512_fmadd_ps(_mm512_fmadd_ps(p, dxv[c], sv[c]), dwv, acc[r][c]);
            }
        }
    }
}

/* One R×C tile over all blocks. Per block and (r, c), with dot = Σ qw·qx and s = dx·Σqx:
 *   Q4_0: dw·(dx·dot - 8·s)   Q8_0 (qw+128): dw·(dx·dot - 128·s)   Q4_1: dw·dx·dot + m·s
 *   Q5_0 (nibble | fifth bit << 4): dw·(dx·dot - 16·s)
 * Each of the 8 lanes of a block holds a partial dot, so the s terms enter per lane divided
 * by 8 (exact: a power of two). */
TGT static INL void blk32_main(int nb, const uint8_t *w, size_t ws, int kind, const int R,
                               const act_row *a, const int C, float *y, size_t ldy) {
    const size_t bsz = kind == K_Q4_0   ? sizeof(blk_q4_0)
                       : kind == K_Q4_1 ? sizeof(blk_q4_1)
                       : kind == K_Q5_0 ? sizeof(blk_q5_0)
                                        : sizeof(blk_q8_0);
    const int qoff = kind == K_Q4_1 ? 4 : kind == K_Q5_0 ? 6 : 2;
    const float sk = kind == K_Q4_0   ? -1.0f
                     : kind == K_Q5_0 ? -2.0f
                     : kind == K_Q8_0 ? -16.0f
                                      : 0.125f;
    const __m512i sel_d = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i sel_m = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    /* pairs, then a lone last block: `two` is a constant in each inlined copy */
    int b = 0;
    for (; b + 1 < nb; b += 2)
        blk32_pair(w, ws, bsz, qoff, kind, sk, sel_d, sel_m, b, 1, R, a, C, acc);
    if (b < nb)
        blk32_pair(w, ws, bsz, qoff, kind, sk, sel_d, sel_m, b, 0, R, a, C, acc);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum16(acc[r][c]);
}

/* ---- K-quants: 64 elements per 512-bit step, maddubs to int16 pairs, then
 * _mm512_dpwssd_epi32 multiplies by the sub-block scales and accumulates in one instruction.
 * Both formats are brought into element order so each activation operand is one load. ---- */

/* Every cache line of the block `ahead` bytes on (see blk32_pair's prefetch). */
TGT static INL void prefetch_block(const void *blk, size_t bsz, size_t ahead) {
    const char *p = (const char *)blk + ahead;
    for (size_t o = 0; o < bsz; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + bsz - 1, _MM_HINT_T0);
}

/* int16 lane i of index vector k picks element (k * per + i / (32 / per)) of a scale vector:
 * Q4_K has 2 scales per 64 elements (per = 2), Q6_K 4 (per = 4). */
TGT static INL __m512i scale_index(int k, int per) {
    const __m512i lane = _mm512_cvtepu8_epi16(
        _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                         21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31));
    return _mm512_add_epi16(_mm512_set1_epi16((short)(k * per)),
                            _mm512_srli_epi16(lane, per == 2 ? 4 : 3));
}

/* Q4_K, per block and (r, c): dx·(d·Σ_s sc_s·dot_s − dmin·Σ_s mn_s·Σx_s). A 64-byte load
 * of qs holds sub-blocks 4L, 4L+2 (low nibbles) and 4L+1, 4L+3 (high): regrouped as
 * [4L | 4L+1] and [4L+2 | 4L+3], each matches 64 consecutive activations. */
TGT static INL void q4k_main(int nb, const uint8_t *w, size_t ws, const int five, const int R,
                             const act_row *a, const int C, float *y, size_t ldy) {
    const size_t bsz = five ? sizeof(blk_q5_k) : sizeof(blk_q4_k);
    const size_t qs_off = five ? offsetof(blk_q5_k, qs) : offsetof(blk_q4_k, qs);
    /* Q5_K: qh read as [qh | qh >> 2], so both 256-bit halves (chunks 2L and 2L + 1 of 32
     * elements) find their sub-blocks' fifth bits at the same shift 4L (lo) and 4L + 1 (hi) */
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2);
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i idx[4] = {scale_index(0, 2), scale_index(1, 2), scale_index(2, 2),
                            scale_index(3, 2)};
    for (int b = 0; b < nb; b++) {
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* Q4_K and Q5_K share d, dmin and scales at the same offsets */
            const blk_q4_k *blk = (const blk_q4_k *)(w + r * ws + b * bsz);
            const uint8_t *qs = (const uint8_t *)blk + qs_off;
            prefetch_block(blk, bsz, (size_t)3 * R * ws);
            __m512i hb = _mm512_setzero_si512();
            if (five)
                hb = _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                                           (const __m256i *)((const blk_q5_k *)blk)->qh)),
                                       shv);
            uint8_t sm8[16];
            q4k_scales_mins16(blk->scales, sm8);
            __m128i sm = _mm_loadu_si128((const __m128i *)sm8);
            __m512i scw = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
            __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
            __m512i isum[4];
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_setzero_si512();
            #pragma GCC unroll 2
            for (int L = 0; L < 2; L++) {
                __m512i q = _mm512_loadu_si512((const void *)(qs + 64 * L));
                __m512i lo = _mm512_and_si512(q, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                if (five) { /* shifts below 8: bits 0, 1 of each byte come from that byte */
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(hb, one), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(hb, two), 3));
                    hb = _mm512_srli_epi16(hb, 4); /* L + 1: bits 4L + 4.. */
                }
                __m512i w0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
                __m512i w1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
                __m512i s0 = _mm512_permutexvar_epi16(idx[2 * L], scw);
                __m512i s1 = _mm512_permutexvar_epi16(idx[2 * L + 1], scw);
                #pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    const int8_t *xq = a[c].q + b * QK_K + 128 * L;
                    __m512i x0 = _mm512_loadu_si512((const void *)xq);
                    __m512i x1 = _mm512_loadu_si512((const void *)(xq + 64));
                    isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(w0, x0), s0);
                    isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(w1, x1), s1);
                }
            }
            __m512 dv = _mm512_set1_ps(h2f(blk->d)), dminv = _mm512_set1_ps(h2f(blk->dmin));
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)(a[c].bsum + b * 16));
                __m512 msum =
                    _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, mins16)));
                __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(isum[c]), dv,
                                           _mm512_mul_ps(msum, dminv));
                acc[r][c] = _mm512_fmadd_ps(t, _mm512_set1_ps(a[c].d[b]), acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum16(acc[r][c]);
}

/* Q6_K, per block and (r, c): d·dx·(Σ_g sc_g·dot_g − 32·Σ_g sc_g·Σx_g), q in 0..63 as the
 * unsigned operand. Half h of a block: ql[64h..+64) and qh[32h..+32) (read as [qh | qh>>2]
 * so both 32-byte halves find their 2 high bits at the same shift) give elements
 * 128h + 0..63 (low nibbles) and 128h + 64..127 (high nibbles). */
TGT static INL void q6k_main(int nb, const uint8_t *w, size_t ws, const int R, const act_row *a,
                             const int C, float *y, size_t ldy) {
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i idx[4] = {scale_index(0, 4), scale_index(1, 4), scale_index(2, 4),
                            scale_index(3, 4)};
    for (int b = 0; b < nb; b++) {
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const blk_q6_k *blk = (const blk_q6_k *)(w + r * ws) + b;
            prefetch_block(blk, sizeof *blk, (size_t)3 * R * ws);
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
            __m512i scw = _mm512_castsi256_si512(sc16);
            __m512i isum[4];
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                isum[c] = _mm512_setzero_si512();
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i l = _mm512_loadu_si512((const void *)(blk->ql + 64 * h));
                __m512i qh = _mm512_srlv_epi16(
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h))),
                    shv);
                __m512i wa = _mm512_or_si512(_mm512_and_si512(l, m4),
                                             _mm512_slli_epi16(_mm512_and_si512(qh, m2), 4));
                __m512i wb = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m2), 4));
                __m512i sa = _mm512_permutexvar_epi16(idx[2 * h], scw);
                __m512i sb = _mm512_permutexvar_epi16(idx[2 * h + 1], scw);
                #pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    const int8_t *xq = a[c].q + b * QK_K + 128 * h;
                    __m512i x0 = _mm512_loadu_si512((const void *)xq);
                    __m512i x1 = _mm512_loadu_si512((const void *)(xq + 64));
                    isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(wa, x0), sa);
                    isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(wb, x1), sb);
                }
            }
            float d = h2f(blk->d);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)(a[c].bsum + b * 16));
                __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                __m512 p = _mm512_cvtepi32_ps(
                    _mm512_sub_epi32(isum[c], _mm512_zextsi256_si512(off)));
                acc[r][c] = _mm512_fmadd_ps(p, _mm512_set1_ps(d * a[c].d[b]), acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum16(acc[r][c]);
}

/* Float weights: 16 elements per step, R×C tile. */
enum { WF32, WF16, WBF16 };
TGT static INL __m512 load16w(const uint8_t *p, int kind) {
    if (kind == WF32)
        return _mm512_loadu_ps((const float *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (kind == WF16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
TGT static INL __m512 load16w_tail(const uint8_t *p, int kind, int n) {
    __mmask16 m = (__mmask16)((1u << n) - 1);
    if (kind == WF32)
        return _mm512_maskz_loadu_ps(m, (const float *)p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (kind == WF16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
TGT static INL void fw_main(int cols, const uint8_t *w, size_t ws, int kind, const int R,
                            const float *const *xf, const int C, float *y, size_t ldy) {
    const int esz = kind == WF32 ? 4 : 2;
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= cols; i += 16) {
        __m512 xv[4];
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            xv[c] = _mm512_loadu_ps(xf[c] + i);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = load16w(w + r * ws + (size_t)i * esz, kind);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    if (i < cols) {
        int n = cols - i;
        __mmask16 m = (__mmask16)((1u << n) - 1);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = load16w_tail(w + r * ws + (size_t)i * esz, kind, n);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xf[c] + i), acc[r][c]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum16(acc[r][c]);
}

/* ---- packed weights (repack.c): 16 rows in the 16 int32 lanes. One 64-byte record part is
 * 16 rows × 4 consecutive elements, so each dpbusd takes 4 activation bytes broadcast to every
 * lane: one load of x feeds 16 rows, and the block scales of the 16 rows are one vector (no
 * horizontal sums, no per-row scale shuffles). Per block and activation row c:
 *   acc_c += cvt(Σ_g dpbusd(w_g, x_c[4g..4g+3])) · (dw · dx_c) + mw · s_c
 * with mw = Q4_1's m, or −off·dw (Q4_0 8, Q5_0 16, Q8_0 128: the unsigned quants' offset).
 * The integer sums are exact, so a lane's value does not depend on C or on how the int
 * chains are split. ---- */
TGT static INL void pk_main(int nb, const uint8_t *wg, const int T, int nr, const act_row *a,
                            const int C, float *y, size_t ldy, int add) {
    const size_t pb = pk_block_bytes(T), doff = pk_d_off(T);
    const float off = T == MD_TYPE_Q4_0   ? 8.0f
                      : T == MD_TYPE_Q5_0 ? 16.0f
                      : T == MD_TYPE_Q8_0 ? 128.0f
                                          : 0.0f;
    const __m512i m4 = _mm512_set1_epi8(15), h16 = _mm512_set1_epi8(16);
    const __m512 noff = _mm512_set1_ps(-off);
    /* decode-sized tiles wait on memory: two int chains hide dpbusd's latency, and the record
     * 4 blocks on is prefetched (the next group follows contiguously) */
    const int split = C <= 2;
    __m512 acc[KCP];
    #pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * pb;
        if (C <= 4)
            for (size_t o = 0; o < pb; o += 64)
                _mm_prefetch((const char *)rec + 4 * pb + o, _MM_HINT_T0);
        __m512i wq[8];
        if (T == MD_TYPE_Q8_0) {
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
                wq[g] = _mm512_loadu_si512((const void *)(rec + 64 * g));
        } else {
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i z = _mm512_loadu_si512((const void *)(rec + 64 * k));
                wq[2 * k] = _mm512_and_si512(z, m4);
                wq[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            }
        }
        if (T == MD_TYPE_Q5_0) {
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                uint64_t hm;
                memcpy(&hm, rec + 256 + 8 * g, 8);
                wq[g] = _mm512_mask_add_epi8(wq[g], (__mmask64)hm, wq[g], h16);
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + doff)));
        __m512 mw = T == MD_TYPE_Q4_1
                        ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + doff + 32)))
                        : _mm512_mul_ps(dw, noff);
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const int8_t *xq = a[c].q + (size_t)b * QK32;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int32_t x4;
                memcpy(&x4, xq + 4 * g, 4);
                if (split && (g & 1))
                    s1 = _mm512_dpbusd_epi32(s1, wq[g], _mm512_set1_epi32(x4));
                else
                    s0 = _mm512_dpbusd_epi32(s0, wq[g], _mm512_set1_epi32(x4));
            }
            if (split)
                s0 = _mm512_add_epi32(s0, s1);
            __m512 f = _mm512_cvtepi32_ps(s0);
            acc[c] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(a[c].d[b])), acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a[c].s[b]), acc[c]);
        }
    }
    __mmask16 m = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    #pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        float *yc = y + (size_t)c * ldy;
        __m512 v = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yc), acc[c]) : acc[c];
        _mm512_mask_storeu_ps(yc, m, v);
    }
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

#define PTILE512(name, T)                                                                          \
    TGT static void name(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,    \
                         size_t ldy, int add) {                                                    \
        _Static_assert(KCP == 8, "DISPATCH8 instantiates C = 1..KCP");                             \
        const int ty = T;                                                                          \
        DISPATCH8(PCALL)                                                                           \
    }
#define PCALL(C) pk_main(nb, wg, ty, nr, a, C, y, ldy, add)
PTILE512(ptile_q4_0, MD_TYPE_Q4_0)
PTILE512(ptile_q4_1, MD_TYPE_Q4_1)
PTILE512(ptile_q5_0, MD_TYPE_Q5_0)
PTILE512(ptile_q8_0, MD_TYPE_Q8_0)
#undef PCALL

/* Instantiate every (R, C) in 1..4 × 1..4 with constants: accumulators stay in registers. */
#define DISPATCH16(CALL)                                                                           \
    switch ((nr - 1) * 4 + (nc - 1)) {                                                             \
    case 0: CALL(1, 1); break;                                                                     \
    case 1: CALL(1, 2); break;                                                                     \
    case 2: CALL(1, 3); break;                                                                     \
    case 3: CALL(1, 4); break;                                                                     \
    case 4: CALL(2, 1); break;                                                                     \
    case 5: CALL(2, 2); break;                                                                     \
    case 6: CALL(2, 3); break;                                                                     \
    case 7: CALL(2, 4); break;                                                                     \
    case 8: CALL(3, 1); break;                                                                     \
    case 9: CALL(3, 2); break;                                                                     \
    case 10: CALL(3, 3); break;                                                                    \
    case 11: CALL(3, 4); break;                                                                    \
    case 12: CALL(4, 1); break;                                                                    \
    case 13: CALL(4, 2); break;                                                                    \
    case 14: CALL(4, 3); break;                                                                    \
    default: CALL(4, 4); break;                                                                    \
    }

TGT static void tile_q4_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) blk32_main(nb, w, ws, K_Q4_0, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q4_1(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) blk32_main(nb, w, ws, K_Q4_1, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q5_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) blk32_main(nb, w, ws, K_Q5_0, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q8_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) blk32_main(nb, w, ws, K_Q8_0, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q4_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4k_main(nb, w, ws, 0, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q5_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4k_main(nb, w, ws, 1, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_q6_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q6k_main(nb, w, ws, R, a, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_f32(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                         const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WF32, R, xf, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_f16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                         const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WF16, R, xf, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

TGT static void tile_bf16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WBF16, R, xf, C, y, ldy)
    DISPATCH16(CALL)
#undef CALL
}

const kernel_table cpu_kernels_avx512 = {
    .f32 = tile_f32, .f16 = tile_f16, .bf16 = tile_bf16,
    .q4_0 = tile_q4_0, .q4_1 = tile_q4_1, .q5_0 = tile_q5_0, .q8_0 = tile_q8_0,
    .q4_k = tile_q4_k, .q5_k = tile_q5_k, .q6_k = tile_q6_k,
    .p_q4_0 = ptile_q4_0, .p_q4_1 = ptile_q4_1, .p_q5_0 = ptile_q5_0, .p_q8_0 = ptile_q8_0,
    .p_q4_k = cpu_ptile_q4_k_avx512, .p_q5_k = cpu_ptile_q5_k_avx512,
    .p_q6_k = cpu_ptile_q6_k_avx512,
};
#else
const kernel_table cpu_kernels_avx512 = {0};
#endif
