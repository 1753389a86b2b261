/* matmul_avx2.c — AVX2+FMA+F16C tile kernels for every weight type, and the activation
 * quantizers (bit-identical to the scalar ones: same products, same round-half-even).
 *
 * Tiles are up to 4 weight rows × 2 activation rows (8 float accumulators: AVX2 has 16
 * registers); a 4×4 tile from the driver runs as two 4×2 passes. Integer dots:
 * _mm256_maddubs_epi16 (u8 weights × s8 activations; Q8_0 weights take the sign trick)
 * then _mm256_madd_epi16 to int32, one float FMA per block with the product of scales.
 * Terms that depend only on Σx (Q4_0's -8, Q4_1's min) use s_b = d_b·Σq of activation
 * block b, computed once at quantization. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

TGT static INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TGT static INL float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes of nibbles -> 32 u8: low nibbles first (elements 0..15), then high (16..31). */
TGT static INL __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(15);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, m)),
                                   _mm_and_si128(_mm_srli_epi16(v, 4), m), 1);
}

/* Q5_0's fifth bits: byte j = 16 where bit j of the 4 bytes at qh is set, else 0 (element
 * order as unpack_nibbles). Byte j of the broadcast picks byte j / 8 of qh, then its bit j % 8. */
TGT static INL __m256i unpack_high_bits(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i pick =
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* 8 int32 lanes of Σ u·s over 32 byte pairs. */
TGT static INL __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Few activation rows (decode, small batches) are memory-bound and the hardware prefetcher
 * alone leaves the loads waiting on DRAM: fetch the block `ahead` bytes on (every cache line
 * of it). */
TGT static INL void prefetch_block(const void *blk, size_t bsz, size_t ahead) {
    const char *p = (const char *)blk + ahead;
    for (size_t o = 0; o < bsz; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + bsz - 1, _MM_HINT_T0);
}

/* ---- Q4_0 / Q4_1 / Q5_0, per block and (r, c) with dot = Σ qw·qx and s = dx·Σqx:
 * Q4_0: dw·(dx·dot - 8·s), Q4_1: dw·dx·dot + m·s, Q5_0: dw·(dx·dot - 16·s) with qw's fifth
 * bit or'ed in before the dot; the s terms enter each of the 8 lanes divided by 8
 * (exact). ---- */
enum { KQ4_0, KQ4_1, KQ5_0 };
TGT static INL void q4_main(int nb, const uint8_t *w, size_t ws, int kind, const int R,
                            const act_row *a, const int C, float *y, size_t ldy) {
    const int q41 = kind == KQ4_1, q50 = kind == KQ5_0;
    const size_t bsz = q41 ? sizeof(blk_q4_1) : q50 ? sizeof(blk_q5_0) : sizeof(blk_q4_0);
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i xq[2];
        __m256 dx[2], sv[2];
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            xq[c] = _mm256_loadu_si256((const __m256i *)(a[c].q + b * QK32));
            dx[c] = _mm256_set1_ps(a[c].d[b]);
            sv[c] = _mm256_set1_ps(a[c].s[b] * (q41 ? 0.125f : q50 ? -2.0f : -1.0f));
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + r * ws + (size_t)b * bsz;
            _mm_prefetch((const char *)blk + (size_t)3 * R * ws, _MM_HINT_T0);
            uint16_t dh, mh;
            memcpy(&dh, blk, 2);
            __m256 dw = _mm256_set1_ps(h2f(dh));
            __m256i wq = unpack_nibbles(blk + (q41 ? 4 : q50 ? 6 : 2));
            if (q50)
                wq = _mm256_or_si256(wq, unpack_high_bits(blk + 2));
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256 p = _mm256_cvtepi32_ps(dot_u8s8(wq, xq[c]));
                if (q41) {
                    acc[r][c] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, dx[c]), acc[r][c]);
                    memcpy(&mh, blk + 2, 2);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(mh)), sv[c], acc[r][c]);
                } else {
                    acc[r][c] = _mm256_fmadd_ps(_mm256_fmadd_ps(p, dx[c], sv[c]), dw, acc[r][c]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum8(acc[r][c]);
}

/* ---- Q8_0: sign trick |w| · sign(x, w) ---- */
TGT static INL void q8_main(int nb, const uint8_t *w, size_t ws, const int R, const act_row *a,
                            const int C, float *y, size_t ldy) {
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i xq[2];
        float dx[2];
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            xq[c] = _mm256_loadu_si256((const __m256i *)(a[c].q + b * QK32));
            dx[c] = a[c].d[b];
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const blk_q8_0 *blk = (const blk_q8_0 *)(w + r * ws) + b;
            _mm_prefetch((const char *)blk + (size_t)3 * R * ws, _MM_HINT_T0);
            float dw = h2f(blk->d);
            __m256i wq = _mm256_loadu_si256((const __m256i *)blk->qs);
            __m256i wa = _mm256_sign_epi8(wq, wq);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256 p = _mm256_cvtepi32_ps(dot_u8s8(wa, _mm256_sign_epi8(xq[c], wq)));
                acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * dx[c]), acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum8(acc[r][c]);
}

/* ---- Q4_K / Q5_K (five): per sub-block of 32, int scale folded into madd; mins via bsums.
 * Q5_K's q = nibble | fifth bit << 4 is at most 31, so maddubs' pair sums (31·128·2) stay
 * clear of int16 saturation. ---- */
TGT static INL void q4k_main(int nb, const uint8_t *w, size_t ws, const int five, const int R,
                             const act_row *a, const int C, float *y, size_t ldy) {
    const size_t bsz = five ? sizeof(blk_q5_k) : sizeof(blk_q4_k);
    const size_t qs_off = five ? offsetof(blk_q5_k, qs) : offsetof(blk_q4_k, qs);
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1), two = _mm256_set1_epi8(2);
    for (int b = 0; b < nb; b++) {
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* Q4_K and Q5_K share d, dmin and scales at the same offsets */
            const blk_q4_k *blk = (const blk_q4_k *)(w + r * ws + b * bsz);
            const uint8_t *qs = (const uint8_t *)blk + qs_off;
            prefetch_block(blk, bsz, (size_t)3 * R * ws);
            __m256i hb = five ? _mm256_loadu_si256((const __m256i *)((const blk_q5_k *)blk)->qh)
                              : _mm256_setzero_si256();
            uint8_t sm8[16];
            q4k_scales_mins16(blk->scales, sm8);
            __m128i sm = _mm_loadu_si128((const __m128i *)sm8);
            /* scales as int16 pairs [s0,s0,s1,s1,..], mins paired with the 16-element bsums */
            __m256i sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm));
            __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
            __m256i isum[2];
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                isum[c] = _mm256_setzero_si256();
            #pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                __m256i lo = _mm256_and_si256(q, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (five) { /* hb: qh >> 2j, bits 0 and 1 sub-blocks 2j (lo) and 2j+1 (hi) */
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hb, two), 3));
                    /* 16-bit shifts move the next byte's bits into bits 6, 7 only: 0, 1 stay
                     * this byte's for the 3 shifts */
                    hb = _mm256_srli_epi16(hb, 2);
                }
                __m256i s_lo = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(2 * j));
                __m256i s_hi = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(2 * j + 1));
                #pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    const int8_t *xq = a[c].q + b * QK_K + 64 * j;
                    __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq));
                    __m256i p1 =
                        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32)));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p0, s_lo));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p1, s_hi));
                }
            }
            float d = h2f(blk->d), dmin = h2f(blk->dmin);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                float dx = a[c].d[b];
                __m256i bs = _mm256_loadu_si256((const __m256i *)(a[c].bsum + b * 16));
                __m256 msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins16));
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(d * dx),
                                            acc[r][c]);
                acc[r][c] = _mm256_fnmadd_ps(msum, _mm256_set1_ps(dmin * dx), acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum8(acc[r][c]);
}

/* ---- Q6_K: q in 0..63 (unsigned operand), -32 offset via bsums, int8 scales per 16 ---- */
TGT static INL void q6k_main(int nb, const uint8_t *w, size_t ws, const int R, const act_row *a,
                             const int C, float *y, size_t ldy) {
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int b = 0; b < nb; b++) {
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const blk_q6_k *blk = (const blk_q6_k *)(w + r * ws) + b;
            prefetch_block(blk, sizeof *blk, (size_t)3 * R * ws);
            __m256i isum[2];
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                isum[c] = _mm256_setzero_si256();
            /* scales as int16, 16 of them: used for the -32·bsum term */
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
            #pragma GCC unroll 4
            for (int h = 0; h < 2; h++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    /* 32 elements = two scale groups of 16: lanes 0..3 and 4..7 of madd */
                    int si = h * 8 + g * 2;
                    __m256i s = _mm256_setr_epi16(
                        blk->scales[si], blk->scales[si], blk->scales[si], blk->scales[si],
                        blk->scales[si], blk->scales[si], blk->scales[si], blk->scales[si],
                        blk->scales[si + 1], blk->scales[si + 1], blk->scales[si + 1],
                        blk->scales[si + 1], blk->scales[si + 1], blk->scales[si + 1],
                        blk->scales[si + 1], blk->scales[si + 1]);
                    #pragma GCC unroll 4
                    for (int c = 0; c < C; c++) {
                        const int8_t *xq = a[c].q + b * QK_K + 128 * h + 32 * g;
                        __m256i p = _mm256_maddubs_epi16(q[g], _mm256_loadu_si256((const __m256i *)xq));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, s));
                    }
                }
            }
            float d = h2f(blk->d);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)(a[c].bsum + b * 16));
                /* Σ_g scale_g · 32 · bsum_g */
                __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                __m256 p = _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[c], off));
                acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * a[c].d[b]), acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[c * ldy + r] = hsum8(acc[r][c]);
}

/* ---- float weights ---- */
enum { WF32, WF16, WBF16 };
TGT static INL __m256 load8w(const uint8_t *p, int kind) {
    if (kind == WF32)
        return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (kind == WF16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
TGT static INL float load1w(const uint8_t *p, int kind) {
    if (kind == WF32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return kind == WF16 ? h2f(h) : md_bf16_to_fp32(h);
}
TGT static INL void fw_main(int cols, const uint8_t *w, size_t ws, int kind, const int R,
                            const float *const *xf, const int C, float *y, size_t ldy) {
    int esz = kind == WF32 ? 4 : 2;
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 xv[2];
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            xv[c] = _mm256_loadu_ps(xf[c] + i);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = load8w(w + r * ws + (size_t)i * esz, kind);
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            float s = hsum8(acc[r][c]);
            for (int k = i; k < cols; k++)
                s += load1w(w + r * ws + (size_t)k * esz, kind) * xf[c][k];
            y[c * ldy + r] = s;
        }
}

/* Instantiate R = 1..4, C = 1..2 with constants so the accumulators stay in registers. */
#define DISPATCH(CALL)                                                                             \
    for (int c0 = 0; c0 < nc; c0 += 2) {                                                           \
        int C_ = nc - c0 >= 2 ? 2 : 1;                                                             \
        const act_row *A = a + c0;                                                                 \
        const float *const *X = xf ? xf + c0 : NULL;                                               \
        float *Y = y + c0 * ldy;                                                                   \
        (void)A;                                                                                   \
        (void)X;                                                                                   \
        switch (nr * 2 + C_ - 1) {                                                                 \
        case 2: CALL(1, 1); break;                                                                 \
        case 3: CALL(1, 2); break;                                                                 \
        case 4: CALL(2, 1); break;                                                                 \
        case 5: CALL(2, 2); break;                                                                 \
        case 6: CALL(3, 1); break;                                                                 \
        case 7: CALL(3, 2); break;                                                                 \
        case 8: CALL(4, 1); break;                                                                 \
        default: CALL(4, 2); break;                                                                \
        }                                                                                          \
    }

TGT static void tile_q4_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4_main(nb, w, ws, KQ4_0, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q4_1(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4_main(nb, w, ws, KQ4_1, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q5_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4_main(nb, w, ws, KQ5_0, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q8_0(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q8_main(nb, w, ws, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q4_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4k_main(nb, w, ws, 0, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q5_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q4k_main(nb, w, ws, 1, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_q6_k(int nb, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) q6k_main(nb, w, ws, R, A, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_f32(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                         const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WF32, R, X, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_f16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                         const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WF16, R, X, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

TGT static void tile_bf16(int cols, const uint8_t *w, size_t ws, int nr, const act_row *a,
                          const float *const *xf, int nc, float *y, size_t ldy) {
#define CALL(R, C) fw_main(cols, w, ws, WBF16, R, X, C, Y, ldy)
    DISPATCH(CALL)
#undef CALL
}

/* ---- activation quantizers ---- */

/* amax of 8k floats at x (k vectors). */
TGT static INL float amax_n(const float *x, int nvec) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < nvec; i++)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + 8 * i), absmask));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 16 floats -> 16 int8 (round half even, as lrintf), returns their sum. */
TGT static INL int quant16(const float *x, __m256 id, int8_t *q) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i s32 = _mm256_add_epi32(a, b);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    __m256i p16 = _mm256_packs_epi32(a, b); /* lanes: a0-3 b0-3 | a4-7 b4-7 */
    __m128i lo = _mm256_castsi256_si128(p16), hi = _mm256_extracti128_si256(p16, 1);
    __m128i p8 = _mm_packs_epi16(lo, hi); /* a0-3 b0-3 a4-7 b4-7 */
    p8 = _mm_shuffle_epi32(p8, _MM_SHUFFLE(3, 1, 2, 0)); /* a0-3 a4-7 b0-3 b4-7 */
    _mm_storeu_si128((__m128i *)q, p8);
    return _mm_cvtsi128_si32(s);
}

TGT static void quant32(const float *x, int cols, int8_t *q, float *d, float *s) {
    for (int b = 0; b < cols / QK32; b++) {
        const float *xb = x + b * QK32;
        float amax = amax_n(xb, 4);
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        int sum = quant16(xb, idv, q + b * QK32) + quant16(xb + 16, idv, q + b * QK32 + 16);
        d[b] = amax / 127.0f;
        s[b] = d[b] * (float)sum;
    }
}

TGT static void quantk(const float *x, int cols, int8_t *q, float *d, int16_t *bsum) {
    for (int b = 0; b < cols / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float amax = amax_n(xb, 32);
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        for (int g = 0; g < 16; g++)
            bsum[b * 16 + g] = (int16_t)quant16(xb + 16 * g, idv, q + b * QK_K + 16 * g);
        d[b] = amax / 127.0f;
    }
}

/* ---- packed weights (repack.c): 8 rows in the 8 int32 lanes, half h of a 16-row record
 * (bytes 32h..32h+31 of each 64-byte part are rows 8h..8h+7 × 4 elements). maddubs of a part
 * against 4 activation bytes broadcast to every lane gives each row's pairs in int16; the
 * pairs of the 8 element groups are summed in int16 before one madd where they cannot
 * overflow (Q4: 8 × 2·15·127 < 2^15; Q5_0: 4 × 2·31·127), one madd per group for Q8_0,
 * whose +128 quants are made signed again and multiplied by the sign trick (|w|, x·sign(w)):
 * maddubs of 255·127 pairs would saturate. Per block and activation row c:
 *   acc_c += cvt(dot) · (dw · dx_c) + mw · s_c   (mw = m, or −off·dw; Q8_0 here: off 0). ---- */
TGT static INL void pk2_main(int nb, const uint8_t *wg, const int T, int h, const act_row *a,
                             const int C, __m256 acc[2]) {
    const size_t pb = pk_block_bytes(T), doff = pk_d_off(T);
    const float off = T == MD_TYPE_Q4_0 ? 8.0f : T == MD_TYPE_Q5_0 ? 16.0f : 0.0f;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int c = 0; c < C; c++)
        acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = wg + (size_t)b * pb;
        __m256i wq[8];
        if (T == MD_TYPE_Q8_0) {
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
                wq[g] = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(rec + 64 * g + 32 * h)),
                    _mm256_set1_epi8((char)0x80));
        } else {
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i z = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 32 * h));
                wq[2 * k] = _mm256_and_si256(z, m4);
                wq[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
            }
        }
        if (T == MD_TYPE_Q5_0) {
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
                wq[g] = _mm256_or_si256(wq[g], unpack_high_bits(rec + 256 + 8 * g + 4 * h));
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + doff + 16 * h)));
        __m256 mw = T == MD_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128(
                                            (const __m128i *)(rec + doff + 32 + 16 * h)))
                                      : _mm256_mul_ps(dw, _mm256_set1_ps(-off));
        #pragma GCC unroll 2
        for (int c = 0; c < C; c++) {
            const int8_t *xq = a[c].q + (size_t)b * QK32;
            __m256i dot = _mm256_setzero_si256(), p16 = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int32_t x4;
                memcpy(&x4, xq + 4 * g, 4);
                __m256i xv = _mm256_set1_epi32(x4);
                if (T == MD_TYPE_Q8_0) {
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wq[g]),
                                                     _mm256_sign_epi8(xv, wq[g]));
                    dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, ones));
                    continue;
                }
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(wq[g], xv));
                if (T == MD_TYPE_Q5_0 && g == 3) { /* 4 groups of 5-bit pairs: flush */
                    dot = _mm256_madd_epi16(p16, ones);
                    p16 = _mm256_setzero_si256();
                }
            }
            if (T != MD_TYPE_Q8_0)
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p16, ones));
            __m256 f = _mm256_cvtepi32_ps(dot);
            acc[c] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(a[c].d[b])), acc[c]);
            acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[c].s[b]), acc[c]);
        }
    }
}

/* Rows [0, nr) of a packed group against a[0..nc): halves of 8 rows × pairs of activation
 * rows (16 registers: 8 unpacked weight vectors, 2 accumulators, the rest scratch). */
TGT static INL void pk2_tile(int nb, const uint8_t *wg, const int T, int nr, const act_row *a,
                             int nc, float *y, size_t ldy, int add) {
    for (int h = 0; h < 2 && 8 * h < nr; h++) {
        int n8 = nr - 8 * h < 8 ? nr - 8 * h : 8;
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n8),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int c = 0; c < nc; c += 2) {
            __m256 acc[2];
            int C = nc - c < 2 ? 1 : 2;
            if (C == 2)
                pk2_main(nb, wg, T, h, a + c, 2, acc);
            else
                pk2_main(nb, wg, T, h, a + c, 1, acc);
            for (int k = 0; k < C; k++) {
                float *yc = y + (size_t)(c + k) * ldy + 8 * h;
                __m256 v = add ? _mm256_add_ps(_mm256_maskload_ps(yc, m), acc[k]) : acc[k];
                _mm256_maskstore_ps(yc, m, v);
            }
        }
    }
}

#define PTILE2(name, T)                                                                            \
    TGT static void name(int nb, const uint8_t *wg, int nr, const act_row *a, int nc, float *y,   \
                         size_t ldy, int add) {                                                    \
        pk2_tile(nb, wg, T, nr, a, nc, y, ldy, add);                                               \
    }
PTILE2(ptile_q4_0, MD_TYPE_Q4_0)
PTILE2(ptile_q4_1, MD_TYPE_Q4_1)
PTILE2(ptile_q5_0, MD_TYPE_Q5_0)
PTILE2(ptile_q8_0, MD_TYPE_Q8_0)
#undef PTILE2

const kernel_table cpu_kernels_avx2 = {
    .f32 = tile_f32, .f16 = tile_f16, .bf16 = tile_bf16, .q4_0 = tile_q4_0,
    .q4_1 = tile_q4_1, .q5_0 = tile_q5_0, .q8_0 = tile_q8_0, .q4_k = tile_q4_k, .q5_k = tile_q5_k,
    .q6_k = tile_q6_k,
    .p_q4_0 = ptile_q4_0, .p_q4_1 = ptile_q4_1, .p_q5_0 = ptile_q5_0, .p_q8_0 = ptile_q8_0,
    .p_q4_k = cpu_ptile_q4_k_avx2, .p_q5_k = cpu_ptile_q5_k_avx2, .p_q6_k = cpu_ptile_q6_k_avx2,
    .quant32 = quant32, .quantk = quantk,
};
#else
const kernel_table cpu_kernels_avx2 = {0};
#endif
