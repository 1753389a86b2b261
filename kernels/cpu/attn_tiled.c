/* attn_tiled.c — blocked (flash-style) attention over the paged F16 KV cache: a tile of query
 * tokens of one sequence times tiles of keys, with an online softmax, so each K/V row is read
 * and converted once per query tile instead of once per query, no score matrix longer than one
 * key tile is ever held, and the exponentials are vector polynomials instead of scalar expf.
 * Scalar, AVX2+F16C and AVX-512 versions, chosen by cpu_simd_level(); a double-precision
 * reference for the tests (cpu_attention_ref_f16). Single-threaded, no allocation.
 *
 * Determinism (docs/engine.md "Attention on the CPU"): key tiles are aligned to absolute
 * positions (multiples of cpu_attention_key_tile(hd)), and a query row's arithmetic depends
 * only on its own q, its position, its window and the K/V values, never on which other rows
 * share its query tile. So a token gives the same bits whether it is one of 32 prompt tokens
 * of a prefill chunk, a lone decode token or a recomputed token after preemption — the
 * engine's chunked prefill and its seeded-sampling guarantee rest on this.
 *
 * Per query row r and key tile [kb, kb + TK), with the row's valid keys [a, z) in it:
 *   s_j = scale * (q_r · k_j)      (sum over d in order from 0, one FMA per d)
 *   m' = max(m, max_j s_j); alpha = e^(m - m'); p_j = e^(s_j - m')
 *   l = l * alpha + Σ_j p_j        (lane-tree sum over the tile, masked lanes exact 0)
 *   o = o * alpha + Σ_j p_j v_j    (in key order)
 * and at the end o / l. */
#include "kernels/cpu/cpu_ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#include "kernels/cpu/vexp.h"
#endif

#define TK_MAX 64

int cpu_attention_key_tile(int hd) {
    int f = hd > 0 ? 256 / hd : 4;
    f = f < 1 ? 1 : f > 4 ? 4 : f;
    return 16 * f;
}

size_t cpu_attention_tiled_scratch(int hd, int rows) {
    size_t tk = (size_t)cpu_attention_key_tile(hd);
    /* Kt [hd][tk], V [tk][hd], p [CPU_ATT_GROUP][tk], m and l [rows], 16 floats of alignment */
    return 2 * tk * (size_t)hd + CPU_ATT_GROUP * tk + 2 * (size_t)rows + 16;
}

static inline size_t slot_of(const int32_t *bt, int block_tokens, int p) {
    return (size_t)bt[p / block_tokens] * (size_t)block_tokens + (size_t)(p % block_tokens);
}

/* sl[j - ka] = the slot of key j for j in [ka, kz): one division per tile, not per key. */
static void tile_slots(size_t *sl, const int32_t *bt, int block_tokens, int ka, int kz) {
    int b = ka / block_tokens, o = ka % block_tokens;
    for (int j = ka; j < kz; j++) {
        sl[j - ka] = (size_t)bt[b] * (size_t)block_tokens + (size_t)o;
        if (++o == block_tokens) {
            o = 0;
            b++;
        }
    }
}

static inline int lo_of(int pos, int window) {
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

/* The layout every version shares: where the tile's converted K/V and the rows' state live. */
typedef struct {
    float *kt; /* [hd][tk]: key j of the tile in lane j - kb */
    float *vt; /* [tk][hd] */
    float *p;  /* [CPU_ATT_GROUP][tk] probabilities of the rows being updated */
    float *m, *l;
    int tk, hd;
    /* AVX-512, a call of at most CPU_ATT_GROUP rows (a decode token): V is read from the
     * cache rows in the V pass instead of staged in vt (one reader: staging only costs) */
    int v_direct;
    const uint16_t *vrow[TK_MAX];
} tile_buf;

static void tile_buf_init(tile_buf *t, float *scratch, int hd, int rows) {
    float *s = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    t->tk = cpu_attention_key_tile(hd);
    t->hd = hd;
    t->kt = s;
    t->vt = t->kt + (size_t)t->tk * hd;
    t->p = t->vt + (size_t)t->tk * hd;
    t->m = t->p + (size_t)CPU_ATT_GROUP * t->tk;
    t->l = t->m + rows;
    t->v_direct = 0;
}

/* Keys [ka, kz) of the tile at kb into kt (transposed) and vt, scalar conversion. Lanes of kt
 * outside [ka, kz) are zero (their scores are masked; zero keeps them finite). */
static void load_tile_scalar(tile_buf *t, const uint16_t *k, const uint16_t *v, size_t stride,
                             const int32_t *bt, int block_tokens, int kb, int ka, int kz) {
    int tk = t->tk, hd = t->hd;
    size_t sl[TK_MAX];
    tile_slots(sl, bt, block_tokens, ka, kz);
    if (ka > kb || kz < kb + tk)
        memset(t->kt, 0, (size_t)tk * hd * sizeof(float));
    for (int j = ka; j < kz; j++) {
        const uint16_t *kr = k + sl[j - ka] * stride, *vr = v + sl[j - ka] * stride;
        float *vo = t->vt + (size_t)(j - kb) * hd;
        for (int d = 0; d < hd; d++) {
            t->kt[(size_t)d * tk + (j - kb)] = md_fp16_to_fp32(kr[d]);
            vo[d] = md_fp16_to_fp32(vr[d]);
        }
    }
}

/* ---- scalar ---- */

/* Rows q[0..R) (one token's heads, hd floats apart) over the tile's keys [a, z). */
static void update_scalar(tile_buf *t, float *out, const float *q, int R, float *m, float *l,
                          int kb, int a, int z, float scale) {
    int tk = t->tk, hd = t->hd;
    for (int r = 0; r < R; r++) {
        const float *qr = q + (size_t)r * hd;
        float *pr = t->p + (size_t)r * tk, mt = -INFINITY;
        for (int j = a - kb; j < z - kb; j++) {
            float s = 0;
            for (int d = 0; d < hd; d++)
                s += qr[d] * t->kt[(size_t)d * tk + j];
            pr[j] = s * scale;
            mt = pr[j] > mt ? pr[j] : mt;
        }
        float mn = m[r] > mt ? m[r] : mt, alpha = expf(m[r] - mn), sum = 0;
        for (int j = a - kb; j < z - kb; j++) {
            pr[j] = expf(pr[j] - mn);
            sum += pr[j];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mn;
        float *o = out + (size_t)r * hd;
        for (int d = 0; d < hd; d++)
            o[d] *= alpha;
        for (int j = a - kb; j < z - kb; j++)
            for (int d = 0; d < hd; d++)
                o[d] += pr[j] * t->vt[(size_t)j * hd + d];
    }
}

#ifdef HAVE_X86
/* ---- AVX2 + F16C: 8-lane chunks ---- */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes of the 8-key chunk at key position c0 inside [a, z), as an all-ones mask. */
AVX2 static inline __m256 valid8(int c0, int a, int z) {
    __m256i j = _mm256_add_epi32(_mm256_set1_epi32(c0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i ge = _mm256_cmpgt_epi32(j, _mm256_set1_epi32(a - 1));
    __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(z), j);
    return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

AVX2 static void load_tile_avx2(tile_buf *t, const uint16_t *k, const uint16_t *v, size_t stride,
                                const int32_t *bt, int block_tokens, int kb, int ka, int kz) {
    int tk = t->tk, hd = t->hd;
    size_t sl[TK_MAX];
    tile_slots(sl, bt, block_tokens, ka, kz);
    if (ka > kb || kz < kb + tk)
        memset(t->kt, 0, (size_t)tk * hd * sizeof(float));
    for (int j = ka; j < kz; j++) {
        const uint16_t *kr = k + sl[j - ka] * stride, *vr = v + sl[j - ka] * stride;
        float *vo = t->vt + (size_t)(j - kb) * hd, *ko = t->kt + (j - kb);
        for (int d = 0; d < hd; d += 8) {
            _mm256_storeu_ps(vo + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + d))));
            __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + d)));
            float tmp[8];
            _mm256_storeu_ps(tmp, kv);
            for (int i = 0; i < 8; i++)
                ko[(size_t)(d + i) * tk] = tmp[i];
        }
    }
}

/* hd % 8 == 0; R <= CPU_ATT_GROUP rows of one token; NC = tk / 8 chunks. Scores and
 * probabilities row by row, then the V pass for the R rows (o * alpha, then p_j v_j in order). */
AVX2 static void update_avx2(tile_buf *t, float *out, const float *q, int R, float *m, float *l,
                             int kb, int a, int z, float scale) {
    int tk = t->tk, hd = t->hd, NC = tk / 8;
    float alpha[CPU_ATT_GROUP];
    for (int r = 0; r < R; r++) {
        const float *qr = q + (size_t)r * hd;
        __m256 s[TK_MAX / 8];
        for (int c = 0; c < NC; c++)
            s[c] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m256 qd = _mm256_broadcast_ss(qr + d);
            const float *kd = t->kt + (size_t)d * tk;
            for (int c = 0; c < NC; c++)
                s[c] = _mm256_fmadd_ps(qd, _mm256_load_ps(kd + 8 * c), s[c]);
        }
        __m256 neg = _mm256_set1_ps(-INFINITY), mx = neg, msk[TK_MAX / 8];
        for (int c = 0; c < NC; c++) {
            msk[c] = valid8(kb + 8 * c, a, z);
            s[c] = _mm256_blendv_ps(neg, _mm256_mul_ps(s[c], _mm256_set1_ps(scale)), msk[c]);
            mx = _mm256_max_ps(mx, s[c]);
        }
        float mt = hmax8(mx), mn = m[r] > mt ? m[r] : mt;
        alpha[r] = _mm256_cvtss_f32(vexp8(_mm256_set1_ps(m[r] - mn)));
        __m256 mv = _mm256_set1_ps(mn), sum = _mm256_setzero_ps();
        float *pr = t->p + (size_t)r * tk;
        for (int c = 0; c < NC; c++) {
            __m256 p = _mm256_and_ps(msk[c], vexp8(_mm256_sub_ps(s[c], mv)));
            _mm256_store_ps(pr + 8 * c, p);
            sum = _mm256_add_ps(sum, p);
        }
        l[r] = l[r] * alpha[r] + hsum8(sum);
        m[r] = mn;
    }
    for (int c0 = 0; c0 < hd; c0 += 32) {
        int nv = (hd - c0 < 32 ? hd - c0 : 32) / 8;
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * hd + c0;
            const float *pr = t->p + (size_t)r * tk;
            __m256 acc[4], al = _mm256_set1_ps(alpha[r]);
            for (int i = 0; i < nv; i++)
                acc[i] = _mm256_mul_ps(_mm256_loadu_ps(o + 8 * i), al);
            for (int j = a - kb; j < z - kb; j++) {
                __m256 w = _mm256_broadcast_ss(pr + j);
                const float *vr = t->vt + (size_t)j * hd + c0;
                for (int i = 0; i < nv; i++)
                    acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * i), acc[i]);
            }
            for (int i = 0; i < nv; i++)
                _mm256_storeu_ps(o + 8 * i, acc[i]);
        }
    }
}

/* ---- AVX-512: 16-lane chunks, K transposed 16 x 16 in registers ---- */
#define X512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

/* r[i] (row i) becomes column i: the classic unpack / unpack64 / 128-bit-lane shuffle. */
X512 static INL void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c */
    for (int c = 0; c < 4; c++) {
        __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
        __m512 v0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 v1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
        t[c] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + c] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(3, 1, 3, 1));
        t[4 + c] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + c] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* hd % 16 == 0. Keys in blocks of 16: 16 rows of 16 dimensions converted and transposed in
 * registers; keys outside [ka, kz) are zero rows (their V rows are never read). */
X512 static void load_tile512(tile_buf *t, const uint16_t *k, const uint16_t *v, size_t stride,
                              const int32_t *bt, int block_tokens, int kb, int ka, int kz) {
    int tk = t->tk, hd = t->hd;
    size_t sl[TK_MAX];
    tile_slots(sl, bt, block_tokens, ka, kz);
    for (int jb = kb; jb < kb + tk; jb += 16) {
        const uint16_t *kr[16];
        for (int i = 0; i < 16; i++) {
            int j = jb + i;
            kr[i] = NULL;
            if (j < ka || j >= kz)
                continue;
            kr[i] = k + sl[j - ka] * stride;
            const uint16_t *vr = v + sl[j - ka] * stride;
            if (t->v_direct) {
                t->vrow[j - kb] = vr;
                continue;
            }
            float *vo = t->vt + (size_t)(j - kb) * hd;
            for (int d = 0; d < hd; d += 16)
                _mm512_store_ps(vo + d,
                                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + d))));
        }
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = kr[i] ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr[i] + d0)))
                             : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < 16; i++)
                _mm512_store_ps(t->kt + (size_t)(d0 + i) * tk + (jb - kb), r[i]);
        }
    }
}

/* R rows of one token (R <= 4), NC = tk / 16 chunks (1, 2 or 4): scores with the key chunks
 * loaded once for the R rows, then the V pass with each V vector loaded once for them. */
X512 static INL void update512_n(tile_buf *t, float *out, const float *q, const int R, const int NC,
                                 float *m, float *l, int kb, int a, int z, float scale) {
    int tk = t->tk, hd = t->hd;
    __m512 s[CPU_ATT_GROUP][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            s[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const float *kd = t->kt + (size_t)d * tk;
        __m512 kc[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            kc[c] = _mm512_load_ps(kd + 16 * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 qd = _mm512_set1_ps(q[(size_t)r * hd + d]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                s[r][c] = _mm512_fmadd_ps(qd, kc[c], s[r][c]);
        }
    }
    __mmask16 msk[4];
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        int lo = a - (kb + 16 * c), hi = z - (kb + 16 * c);
        lo = lo < 0 ? 0 : lo > 16 ? 16 : lo;
        hi = hi < 0 ? 0 : hi > 16 ? 16 : hi;
        msk[c] = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    }
    float alpha[CPU_ATT_GROUP];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m512 sc = _mm512_set1_ps(scale), mx = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            s[r][c] = _mm512_mul_ps(s[r][c], sc);
            mx = _mm512_mask_max_ps(mx, msk[c], mx, s[r][c]);
        }
        float mt = _mm512_reduce_max_ps(mx), mn = m[r] > mt ? m[r] : mt;
        alpha[r] = _mm512_cvtss_f32(vexp16(_mm512_set1_ps(m[r] - mn)));
        __m512 mv = _mm512_set1_ps(mn), sum = _mm512_setzero_ps();
        float *pr = t->p + (size_t)r * tk;
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            __m512 p = _mm512_maskz_mov_ps(msk[c], vexp16(_mm512_sub_ps(s[r][c], mv)));
            _mm512_store_ps(pr + 16 * c, p);
            sum = _mm512_add_ps(sum, p);
        }
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
        m[r] = mn;
    }
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int nv = (hd - c0 < 64 ? hd - c0 : 64) / 16;
        __m512 acc[CPU_ATT_GROUP][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 al = _mm512_set1_ps(alpha[r]);
            for (int i = 0; i < nv; i++)
                acc[r][i] = _mm512_mul_ps(_mm512_loadu_ps(out + (size_t)r * hd + c0 + 16 * i), al);
        }
        if (nv == 4 && t->v_direct) {
            for (int j = a - kb; j < z - kb; j++) {
                const uint16_t *vr = t->vrow[j] + c0;
                __m512 vv[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * i)));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m512 w = _mm512_set1_ps(t->p[(size_t)r * tk + j]);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++)
                        acc[r][i] = _mm512_fmadd_ps(w, vv[i], acc[r][i]);
                }
            }
        } else if (nv == 4) {
            for (int j = a - kb; j < z - kb; j++) {
                const float *vr = t->vt + (size_t)j * hd + c0;
                __m512 vv[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    vv[i] = _mm512_load_ps(vr + 16 * i);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m512 w = _mm512_set1_ps(t->p[(size_t)r * tk + j]);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++)
                        acc[r][i] = _mm512_fmadd_ps(w, vv[i], acc[r][i]);
                }
            }
        } else {
            for (int j = a - kb; j < z - kb; j++) {
                const float *vr = t->vt + (size_t)j * hd + c0;
                const uint16_t *vh = t->v_direct ? t->vrow[j] + c0 : NULL;
                for (int i = 0; i < nv; i++) {
                    __m512 vv =
                        vh ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vh + 16 * i)))
                           : _mm512_load_ps(vr + 16 * i);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        acc[r][i] = _mm512_fmadd_ps(_mm512_set1_ps(t->p[(size_t)r * tk + j]), vv,
                                                    acc[r][i]);
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            for (int i = 0; i < nv; i++)
                _mm512_storeu_ps(out + (size_t)r * hd + c0 + 16 * i, acc[r][i]);
    }
}

#define U512(R, NC)                                                                                \
    X512 static void update512_##R##_##NC(tile_buf *t, float *out, const float *q, float *m,       \
                                          float *l, int kb, int a, int z, float scale) {           \
        update512_n(t, out, q, R, NC, m, l, kb, a, z, scale);                                      \
    }
U512(1, 1)
U512(2, 1)
U512(3, 1)
U512(4, 1)
U512(1, 2)
U512(2, 2)
U512(3, 2)
U512(4, 2)
U512(1, 4)
U512(2, 4)
U512(3, 4)
U512(4, 4)
typedef void (*upd512_fn)(tile_buf *, float *, const float *, float *, float *, int, int, int,
                          float);
static const upd512_fn upd512[3][CPU_ATT_GROUP] = {
    {update512_1_1, update512_2_1, update512_3_1, update512_4_1},
    {update512_1_2, update512_2_2, update512_3_2, update512_4_2},
    {update512_1_4, update512_2_4, update512_3_4, update512_4_4},
};
#endif

enum { LVL_SCALAR, LVL_AVX2, LVL_512 };

static int level_for(int hd) {
#ifdef HAVE_X86
    int lv = cpu_simd_level();
    if (lv >= CPU_SIMD_AVX512VNNI && hd % 16 == 0)
        return LVL_512;
    if (lv >= CPU_SIMD_AVX2 && hd % 8 == 0)
        return LVL_AVX2;
#endif
    return LVL_SCALAR;
}

void cpu_attention_tiled_f16(float *out, size_t o_stride, const float *q, size_t q_stride, int nt,
                             const int32_t *pos, int G, const uint16_t *k, const uint16_t *v,
                             size_t kv_stride, const int32_t *block_table, int block_tokens,
                             int window, int hd, float scale, float *scratch) {
    if (nt < 1 || G < 1 || hd < 1)
        return;
    tile_buf t;
    tile_buf_init(&t, scratch, hd, nt * G);
    int lv = level_for(hd), tk = t.tk;
    t.v_direct = lv == LVL_512 && nt * G <= CPU_ATT_GROUP;
    int lo_min = pos[0], hi_max = 0;
    for (int i = 0; i < nt; i++) {
        int lo = lo_of(pos[i], window);
        lo_min = lo < lo_min ? lo : lo_min;
        hi_max = pos[i] + 1 > hi_max ? pos[i] + 1 : hi_max;
        for (int g = 0; g < G; g++) {
            memset(out + (size_t)i * o_stride + (size_t)g * hd, 0, (size_t)hd * sizeof(float));
            t.m[i * G + g] = -INFINITY;
            t.l[i * G + g] = 0;
        }
    }
    for (int kb = lo_min / tk * tk; kb < hi_max; kb += tk) {
        int ka = kb > lo_min ? kb : lo_min, kz = kb + tk < hi_max ? kb + tk : hi_max;
#ifdef HAVE_X86
        if (lv == LVL_512)
            load_tile512(&t, k, v, kv_stride, block_table, block_tokens, kb, ka, kz);
        else if (lv == LVL_AVX2)
            load_tile_avx2(&t, k, v, kv_stride, block_table, block_tokens, kb, ka, kz);
        else
#endif
            load_tile_scalar(&t, k, v, kv_stride, block_table, block_tokens, kb, ka, kz);
        for (int i = 0; i < nt; i++) {
            int lo = lo_of(pos[i], window), a = ka > lo ? ka : lo;
            int z = kz < pos[i] + 1 ? kz : pos[i] + 1;
            if (a >= z)
                continue;
            for (int g0 = 0; g0 < G; g0 += CPU_ATT_GROUP) {
                int R = G - g0 < CPU_ATT_GROUP ? G - g0 : CPU_ATT_GROUP;
                float *o = out + (size_t)i * o_stride + (size_t)g0 * hd;
                const float *qr = q + (size_t)i * q_stride + (size_t)g0 * hd;
                float *m = t.m + i * G + g0, *l = t.l + i * G + g0;
#ifdef HAVE_X86
                if (lv == LVL_512)
                    upd512[tk == 16   ? 0
                           : tk == 32 ? 1
                                      : 2][R - 1](&t, o, qr, m, l, kb, a, z, scale);
                else if (lv == LVL_AVX2)
                    update_avx2(&t, o, qr, R, m, l, kb, a, z, scale);
                else
#endif
                    update_scalar(&t, o, qr, R, m, l, kb, a, z, scale);
            }
        }
    }
    for (int i = 0; i < nt; i++)
        for (int g = 0; g < G; g++) {
            float *o = out + (size_t)i * o_stride + (size_t)g * hd;
            float r = t.l[i * G + g] > 0 ? 1.0f / t.l[i * G + g] : 0.0f;
            for (int d = 0; d < hd; d++)
                o[d] *= r;
        }
}

void cpu_attention_ref_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                           size_t row_stride, const int32_t *block_table, int block_tokens, int pos,
                           int window, int hd, float scale) {
    int lo = lo_of(pos, window);
    double mx = -INFINITY, sum = 0;
    for (int p = lo; p <= pos; p++) {
        const uint16_t *kr = k + slot_of(block_table, block_tokens, p) * row_stride;
        double s = 0;
        for (int d = 0; d < hd; d++)
            s += (double)q[d] * md_fp16_to_fp32(kr[d]);
        s *= scale;
        mx = s > mx ? s : mx;
    }
    double acc[1024];
    for (int d = 0; d < hd && d < 1024; d++)
        acc[d] = 0;
    for (int p = lo; p <= pos; p++) {
        size_t sl = slot_of(block_table, block_tokens, p) * row_stride;
        const uint16_t *kr = k + sl, *vr = v + sl;
        double s = 0;
        for (int d = 0; d < hd; d++)
            s += (double)q[d] * md_fp16_to_fp32(kr[d]);
        double w = exp(s * scale - mx);
        sum += w;
        for (int d = 0; d < hd && d < 1024; d++)
            acc[d] += w * md_fp16_to_fp32(vr[d]);
    }
    for (int d = 0; d < hd && d < 1024; d++)
        out[d] = (float)(acc[d] / sum);
}
