/* enc_gemm.c — products of many tokens with one weight, for encoder models (cpu_ops.h
 * cpu_lin_*): y [T, N] = x [T, K] · Wᵀ + b, then the exact GELU, or added to y (the residual).
 *
 * W is packed once, at model load, into panels of 32 output rows stored k-major (panel p,
 * step k: the 32 weights W[32p .. 32p+31][k] side by side), so the AVX-512 micro-kernel keeps
 * a tile of 12 tokens x 32 outputs in 24 registers and, per k, loads two weight vectors and
 * broadcasts 12 activations: 24 FMAs per 14 loads, bound by the FMA units, where the dot
 * product kernels of matmul.c (made for a few tokens) finish each output with a horizontal
 * sum. BF16: W and x rounded to BF16 (nearest even), k taken in pairs by VDPBF16PS into F32
 * accumulators: twice the multiply rate of F32 FMAs, half the weight bytes (AVX512-BF16).
 *
 * Work: (48 tokens, a group of panels that stays in L2) items claimed from an atomic counter,
 * so a thread the OS deschedules holds nobody up. Each output element is the same sum in the
 * same order (k ascending, one accumulator) whatever T, the item or the thread, so an input
 * embeds to the same bits alone or packed with others. cpu_lin_ref is the scalar reference. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define NR 32 /* outputs per panel */
#define MR 12 /* tokens per micro-tile */
#define MB 48 /* tokens per work item */
#define MA 32 /* tokens per AMX tile pair (and rows of BF16 activations per thread) */

struct cpu_lin {
    int N, K, K2, np; /* K2: k pairs (BF16); np: panels */
    int prec;         /* CPU_LIN_F32, CPU_LIN_BF16 or CPU_LIN_WBF16 */
    int amx;          /* CPU_LIN_BF16 by AMX tiles (cpu_lin_amx_ok, K2 a multiple of 16) */
    void *wp;         /* F32: [np][K][32]; BF16, WBF16: [np][K2][32][2] (uint16) */
};

int cpu_lin_bf16_ok(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return cpu_simd_level() >= CPU_SIMD_AVX512VNNI && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* VDPBF16PS retires at twice the F32 FMA rate on AMD Zen 4 (docs/benchmarks.md: packed BF16
 * 1.9x packed F32 on the EPYC box) but at half of it on the Intel Xeon measured since (113 vs
 * 224 GFLOP/s per core): docs/kernels.md "Packed float products". */
int cpu_lin_bf16_fast(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return cpu_lin_bf16_ok() && (__builtin_cpu_is("amd") || cpu_lin_amx_ok());
#else
    return 0;
#endif
}

int cpu_lin_prec(const cpu_lin *l) {
    return l->prec;
}

/* AMX-BF16 (TDPBF16PS: a 16 x 32 by 32 x 16 BF16 product per instruction, ~15x the F32 FMA
 * rate measured on the Intel Xeon box) where the CPU has it and Linux grants the process the
 * tile state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), asked once. */
static atomic_int g_amx = -1;
int cpu_lin_amx_ok(void) {
    int v = atomic_load(&g_amx);
    if (v < 0) {
        v = 0;
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
        unsigned a, b, c, d;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) &&
            __builtin_cpu_supports("avx512bf16"))
            v = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#endif
        atomic_store(&g_amx, v);
    }
    return v && cpu_amx_use(); /* the AVX-512 level, and not switched off (MEDLEY_AMX=0) */
}

size_t cpu_lin_scratch_size(int K, int n_threads) {
    return (size_t)(n_threads > 0 ? n_threads : 1) * (MA * (size_t)((K + 1) / 2) * 4 + 64);
}

void cpu_lin_free(cpu_lin *l) {
    if (l) {
        free(l->wp);
        free(l);
    }
}

cpu_lin *cpu_lin_alloc(int N, int K, int prec) {
    if (N < 1 || K < 1 || cpu_simd_level() < CPU_SIMD_AVX512VNNI || prec < CPU_LIN_F32 ||
        prec > CPU_LIN_WBF16 || (prec == CPU_LIN_BF16 && !cpu_lin_bf16_ok()))
        return NULL;
    cpu_lin *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->N = N;
    l->K = K;
    l->K2 = (K + 1) / 2;
    l->np = (N + NR - 1) / NR;
    l->prec = prec;
    l->amx = prec == CPU_LIN_BF16 && l->K2 % 16 == 0 && cpu_lin_amx_ok();
    size_t n =
        prec != CPU_LIN_F32 ? (size_t)l->np * l->K2 * NR * 2 * 2 : (size_t)l->np * K * NR * 4;
    if (posix_memalign(&l->wp, 64, n)) {
        free(l);
        return NULL;
    }
    memset(l->wp, 0, n); /* the padding rows and the odd K's last pair stay 0 */
    return l;
}

/* Row r (K floats) into l's panels: rounded to BF16 (nearest even; a BF16 weight's values are
 * kept exactly) or as they are. */
static void pack_row(cpu_lin *l, const float *row, int r) {
    int p = r / NR, o = r % NR, K = l->K;
    if (l->prec != CPU_LIN_F32) {
        uint16_t *d = (uint16_t *)l->wp + (size_t)p * l->K2 * NR * 2;
        for (int k = 0; k < K; k++)
            d[((size_t)(k / 2) * NR + o) * 2 + k % 2] = md_fp32_to_bf16(row[k]);
    } else {
        float *d = (float *)l->wp + (size_t)p * K * NR;
        for (int k = 0; k < K; k++)
            d[(size_t)k * NR + o] = row[k];
    }
}

int cpu_lin_pack_rows(cpu_lin *l, int wtype, const void *W, int r0, int r1) {
    if (!l || r0 < 0 || r1 > l->N || r0 > r1 ||
        (wtype != MD_TYPE_F32 && wtype != MD_TYPE_F16 && wtype != MD_TYPE_BF16))
        return -1;
    float *row = malloc((size_t)l->K * sizeof *row);
    if (!row)
        return -1;
    size_t rb = md_type_row_bytes(wtype, l->K);
    for (int r = r0; r < r1; r++) {
        cpu_dequant_row(wtype, (const char *)W + (size_t)r * rb, row, l->K);
        pack_row(l, row, r);
    }
    free(row);
    return 0;
}

cpu_lin *cpu_lin_copy(const cpu_lin *src, int prec) {
    cpu_lin *l = cpu_lin_alloc(src->N, src->K, prec);
    float *row = l ? malloc((size_t)src->K * sizeof *row) : NULL;
    if (!row) {
        cpu_lin_free(l);
        return NULL;
    }
    for (int r = 0; r < src->N; r++) {
        cpu_lin_row(src, r, row);
        pack_row(l, row, r);
    }
    free(row);
    return l;
}

cpu_lin *cpu_lin_pack(int wtype, const void *W, int N, int K, int prec) {
    cpu_lin *l = cpu_lin_alloc(N, K, prec);
    if (l && cpu_lin_pack_rows(l, wtype, W, 0, N)) {
        cpu_lin_free(l);
        return NULL;
    }
    return l;
}

void cpu_lin_row(const cpu_lin *l, int r, float *out) {
    int p = r / NR, o = r % NR;
    for (int k = 0; k < l->K; k++)
        out[k] =
            l->prec != CPU_LIN_F32
                ? md_bf16_to_fp32(((const uint16_t *)l->wp)[(size_t)p * l->K2 * NR * 2 +
                                                            ((size_t)(k / 2) * NR + o) * 2 + k % 2])
                : ((const float *)l->wp)[(size_t)p * l->K * NR + (size_t)k * NR + o];
}

static float gelu_ref(double v) {
    return (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
}

void cpu_lin_ref(int wtype, const void *W, int N, int K, const float *bias, const float *x, int T,
                 float *y, int epi, int prec) {
    float *row = malloc((size_t)K * sizeof *row);
    if (!row)
        return;
    size_t rb = md_type_row_bytes(wtype, K);
    for (int n = 0; n < N; n++) {
        cpu_dequant_row(wtype, (const char *)W + (size_t)n * rb, row, K);
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                float a = row[k], b = x[(size_t)t * K + k];
                if (prec != CPU_LIN_F32)
                    a = md_bf16_to_fp32(md_fp32_to_bf16(a));
                if (prec == CPU_LIN_BF16)
                    b = md_bf16_to_fp32(md_fp32_to_bf16(b));
                s += (double)a * b;
            }
            s += bias ? bias[n] : 0;
            float *o = y + (size_t)t * N + n;
            *o = epi == CPU_LIN_GELU  ? gelu_ref(s)
                 : epi == CPU_LIN_ADD ? (float)(*o + s)
                                      : (float)s;
        }
    }
    free(row);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,f16c")))
#define TGTB __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2,f16c")))
#define INL inline __attribute__((always_inline))

/* tile [R][32] = x rows [R] (ldx floats apart) · panel wp [K][32]. */
TGT static INL void ukr_f32(const int R, int K, const float *wp, const float *x, size_t ldx,
                            float *tile) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++)
        c0[i] = c1[i] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 w0 = _mm512_load_ps(wp + (size_t)k * NR),
               w1 = _mm512_load_ps(wp + (size_t)k * NR + 16);
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512 xi = _mm512_set1_ps(x[i * ldx + k]);
            c0[i] = _mm512_fmadd_ps(w0, xi, c0[i]);
            c1[i] = _mm512_fmadd_ps(w1, xi, c1[i]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        _mm512_store_ps(tile + i * NR, c0[i]);
        _mm512_store_ps(tile + i * NR + 16, c1[i]);
    }
}

/* The same with BF16 pairs: xb rows [R] of K2 pairs (ldx pairs apart), panel wp [K2][32][2]. */
TGTB static INL void ukr_bf16(const int R, int K2, const uint16_t *wp, const uint32_t *xb,
                              size_t ldx, float *tile) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++)
        c0[i] = c1[i] = _mm512_setzero_ps();
    for (int k = 0; k < K2; k++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(wp + (size_t)k * NR * 2),
                 w1 = (__m512bh)_mm512_load_si512(wp + (size_t)k * NR * 2 + 32);
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512bh xi = (__m512bh)_mm512_set1_epi32((int)xb[i * ldx + k]);
            c0[i] = _mm512_dpbf16_ps(c0[i], w0, xi);
            c1[i] = _mm512_dpbf16_ps(c1[i], w1, xi);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        _mm512_store_ps(tile + i * NR, c0[i]);
        _mm512_store_ps(tile + i * NR + 16, c1[i]);
    }
}

/* The F32 product over BF16 weights: each k pair's two vectors of 16 outputs widened to F32
 * (a BF16 is the high half of its F32: the even k shifted up, the odd k masked), then the FMAs
 * of ukr_f32 in its order (k ascending, one accumulator), x unrounded: the same bits as ukr_f32
 * over F32 panels of the same weights, with half the weight bytes. K odd: the last pair's odd
 * half is padding (never read from x). */
TGT static INL void ukr_wbf16(const int R, int K, const uint16_t *wp, const float *x, size_t ldx,
                              float *tile) {
    __m512 c0[MR], c1[MR];
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 12
    for (int i = 0; i < R; i++)
        c0[i] = c1[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 2 <= K; k += 2) {
        __m512i p0 = _mm512_load_si512(wp + (size_t)k * NR),
                p1 = _mm512_load_si512(wp + (size_t)k * NR + 32);
        __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(p0, 16)),
               e1 = _mm512_castsi512_ps(_mm512_slli_epi32(p1, 16)),
               o0 = _mm512_castsi512_ps(_mm512_and_si512(p0, hi)),
               o1 = _mm512_castsi512_ps(_mm512_and_si512(p1, hi));
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512 xe = _mm512_set1_ps(x[i * ldx + k]);
            c0[i] = _mm512_fmadd_ps(e0, xe, c0[i]);
            c1[i] = _mm512_fmadd_ps(e1, xe, c1[i]);
        }
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512 xo = _mm512_set1_ps(x[i * ldx + k + 1]);
            c0[i] = _mm512_fmadd_ps(o0, xo, c0[i]);
            c1[i] = _mm512_fmadd_ps(o1, xo, c1[i]);
        }
    }
    if (k < K) {
        __m512 e0 = _mm512_castsi512_ps(
                   _mm512_slli_epi32(_mm512_load_si512(wp + (size_t)k * NR), 16)),
               e1 = _mm512_castsi512_ps(
                   _mm512_slli_epi32(_mm512_load_si512(wp + (size_t)k * NR + 32), 16));
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512 xe = _mm512_set1_ps(x[i * ldx + k]);
            c0[i] = _mm512_fmadd_ps(e0, xe, c0[i]);
            c1[i] = _mm512_fmadd_ps(e1, xe, c1[i]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        _mm512_store_ps(tile + i * NR, c0[i]);
        _mm512_store_ps(tile + i * NR + 16, c1[i]);
    }
}

#define DISPATCH12(CALL)                                                                           \
    switch (r) {                                                                                   \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    case 5: CALL(5); break;                                                                        \
    case 6: CALL(6); break;                                                                        \
    case 7: CALL(7); break;                                                                        \
    case 8: CALL(8); break;                                                                        \
    case 9: CALL(9); break;                                                                        \
    case 10: CALL(10); break;                                                                      \
    case 11: CALL(11); break;                                                                      \
    default: CALL(12); break;                                                                      \
    }

TGT static void tile_f32(int r, int K, const float *wp, const float *x, size_t ldx, float *tile){
#define CALL(R) ukr_f32(R, K, wp, x, ldx, tile)
    DISPATCH12(CALL)
#undef CALL
}

TGTB static void tile_bf16(int r, int K2, const uint16_t *wp, const uint32_t *xb, size_t ldx,
                           float *tile){
#define CALL(R) ukr_bf16(R, K2, wp, xb, ldx, tile)
    DISPATCH12(CALL)
#undef CALL
}

TGT static void tile_wbf16(int r, int K, const uint16_t *wp, const float *x, size_t ldx,
                           float *tile) {
#define CALL(R) ukr_wbf16(R, K, wp, x, ldx, tile)
    DISPATCH12(CALL)
#undef CALL
}

#define TGTA                                                                                       \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* The AMX tile configuration: tiles 0-3 the 2 x 2 F32 accumulators (16 tokens x 16 outputs),
 * 4-5 two blocks of 16 tokens x 16 k pairs, 6-7 the panel's two halves, 16 k pairs x 16
 * outputs; every tile 16 rows of 64 bytes. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* A constant: GCC 12 does not see _tile_loadconfig read its operand and drops the stores
 * that would fill a local one. */
static const _Alignas(64) amx_cfg g_amx_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* The tile registers are shared with matmul_amx.c's int8 kernels on the same thread: whoever
 * needs its shapes loads them and says so in cpu_amx_cfg_loaded (quant_blocks.h); nobody
 * releases the state behind the other's back. */
TGTA static void amx_begin(void) {
    if (cpu_amx_cfg_loaded != &g_amx_cfg) {
        _tile_loadconfig(&g_amx_cfg);
        cpu_amx_cfg_loaded = &g_amx_cfg;
    }
}

/* tile [32][32] = xb rows [32] (ldx pairs apart) · panel wp [K2][32][2], K2 a multiple of 16:
 * per 16 k pairs two activation tiles, two weight tiles (rows 128 bytes apart in the panel) and
 * four TDPBF16PS. Each row's sums depend only on that row (k ascending): a token gets the same
 * bits in any of the 32 rows, beside any others. */
TGTA static void tile_amx(int K2, const uint16_t *wp, const uint32_t *xb, size_t ldx, float *tile) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < K2; k += 16) {
        _tile_loadd(4, xb + k, ldx * 4);
        _tile_loadd(5, xb + 16 * ldx + k, ldx * 4);
        _tile_loadd(6, wp + (size_t)k * NR * 2, NR * 2 * 2);
        _tile_loadd(7, wp + (size_t)k * NR * 2 + 32, NR * 2 * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, tile, NR * 4);
    _tile_stored(1, tile + 16, NR * 4);
    _tile_stored(2, tile + 16 * NR, NR * 4);
    _tile_stored(3, tile + 16 * NR + 16, NR * 4);
}

/* The same for 16 rows (xb rows [16]; tile rows 0..15): half the work when a block has at most
 * 16 tokens (decode), each row's sums computed exactly as in tile_amx. */
TGTA static void tile_amx16(int K2, const uint16_t *wp, const uint32_t *xb, size_t ldx,
                            float *tile) {
    _tile_zero(0);
    _tile_zero(1);
    for (int k = 0; k < K2; k += 16) {
        _tile_loadd(4, xb + k, ldx * 4);
        _tile_loadd(6, wp + (size_t)k * NR * 2, NR * 2 * 2);
        _tile_loadd(7, wp + (size_t)k * NR * 2 + 32, NR * 2 * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, tile, NR * 4);
    _tile_stored(1, tile + 16, NR * 4);
}

/* x rows [r] (K floats each) as BF16 pairs [r][K2] (the odd K's last pair padded with 0). */
TGTB static void x_to_bf16(const float *x, int r, int K, int K2, uint32_t *xb) {
    for (int i = 0; i < r; i++) {
        const float *xr = x + (size_t)i * K;
        uint16_t *d = (uint16_t *)(xb + (size_t)i * K2);
        int k = 0;
        for (; k + 32 <= K; k += 32) {
            __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + k + 16), _mm512_loadu_ps(xr + k));
            _mm512_storeu_si512(d + k, (__m512i)h);
        }
        for (; k < K; k++)
            d[k] = md_fp32_to_bf16(xr[k]);
        if (K % 2)
            d[K] = 0;
    }
}

/* y rows [r] (ldy apart), columns [0, nc) = tile + bias, then GELU / added to y. */
TGT static void epilogue(const float *tile, int r, int nc, const float *bias, float *y, size_t ldy,
                         int epi) {
    __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1);
    __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xffff : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int i = 0; i < r; i++) {
        float *yr = y + (size_t)i * ldy;
        __m512 v0 = _mm512_add_ps(_mm512_load_ps(tile + i * NR), b0);
        __m512 v1 = _mm512_add_ps(_mm512_load_ps(tile + i * NR + 16), b1);
        if (epi == CPU_LIN_ADD) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, yr), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, yr + 16), v1);
        }
        _mm512_mask_storeu_ps(yr, m0, v0);
        _mm512_mask_storeu_ps(yr + 16, m1, v1);
        if (epi == CPU_LIN_GELU)
            cpu_gelu_erf(yr, nc);
    }
}

typedef struct {
    const cpu_lin *l;
    const float *bias, *x;
    float *y;
    int T, epi;
    uint8_t *scratch;
    size_t per_thread;
    int pb, n_pb, n_items;
    atomic_int next;
} lin_job;

static void lin_worker(void *ctx, int ith, int nth) {
    lin_job *j = ctx;
    const cpu_lin *l = j->l;
    (void)nth;
    uint32_t *xb =
        (uint32_t *)(((uintptr_t)(j->scratch + (size_t)ith * j->per_thread) + 63) & ~(uintptr_t)63);
    _Alignas(64) float tile[MA * NR];
    int step = l->amx ? MA : MR, mb = l->amx ? 2 * MA : MB;
    if (l->amx)
        amx_begin();
    for (;;) {
        int item = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (item >= j->n_items)
            break;
        int t0 = item / j->n_pb * mb, t1 = t0 + mb < j->T ? t0 + mb : j->T;
        int p0 = item % j->n_pb * j->pb, p1 = p0 + j->pb < l->np ? p0 + j->pb : l->np;
        for (int t = t0; t < t1; t += step) {
            int r = t1 - t < step ? t1 - t : step;
            const float *x = j->x + (size_t)t * l->K;
            if (l->prec == CPU_LIN_BF16)
                x_to_bf16(x, r, l->K, l->K2, xb);
            int rows = r <= 16 ? 16 : MA; /* rows past the tokens: zeros, outputs not stored */
            if (l->amx && r < rows)
                memset(xb + (size_t)r * l->K2, 0, (size_t)(rows - r) * l->K2 * 4);
            for (int p = p0; p < p1; p++) {
                const uint16_t *wh = (const uint16_t *)l->wp + (size_t)p * l->K2 * NR * 2;
                if (l->amx && rows == 16)
                    tile_amx16(l->K2, wh, xb, (size_t)l->K2, tile);
                else if (l->amx)
                    tile_amx(l->K2, wh, xb, (size_t)l->K2, tile);
                else if (l->prec == CPU_LIN_BF16)
                    tile_bf16(r, l->K2, wh, xb, (size_t)l->K2, tile);
                else if (l->prec == CPU_LIN_WBF16)
                    tile_wbf16(r, l->K, wh, x, (size_t)l->K, tile);
                else
                    tile_f32(r, l->K, (const float *)l->wp + (size_t)p * l->K * NR, x, (size_t)l->K,
                             tile);
                int n0 = p * NR, nc = l->N - n0 < NR ? l->N - n0 : NR;
                epilogue(tile, r, nc, j->bias ? j->bias + n0 : NULL, j->y + (size_t)t * l->N + n0,
                         (size_t)l->N, j->epi);
            }
        }
    }
}

void cpu_lin_run(cpu_pool *p, const cpu_lin *l, const float *bias, const float *x, int T, float *y,
                 int epi, void *scratch) {
    if (T < 1)
        return;
    int nth = cpu_pool_size(p);
    lin_job j = {.l = l,
                 .bias = bias,
                 .x = x,
                 .y = y,
                 .T = T,
                 .epi = epi,
                 .scratch = scratch,
                 .per_thread = cpu_lin_scratch_size(l->K, 1)};
    /* A group of panels small enough to stay in L2 (512 KiB; 1.5 MiB for AMX, whose products
     * are fast enough that converting each token's x once per group showed at n = 4096: 358
     * -> 446 GFLOP/s on 1536 x 576) while the item's tokens pass over it; smaller groups when
     * the tokens alone make too few items for the threads. */
    size_t panel = (size_t)l->K * NR * (l->prec != CPU_LIN_F32 ? 2 : 4);
    int mb = l->amx ? 2 * MA : MB;
    int pb = (int)(((l->amx ? 1536u : 512u) << 10) / panel), n_tb = (T + mb - 1) / mb;
    if (pb < 1)
        pb = 1;
    if (pb > l->np)
        pb = l->np;
    while (pb > 1 && n_tb * ((l->np + pb - 1) / pb) < 4 * nth)
        pb = (pb + 1) / 2;
    j.pb = pb;
    j.n_pb = (l->np + pb - 1) / pb;
    j.n_items = n_tb * j.n_pb;
    atomic_init(&j.next, 0);
    if (nth > 1 && j.n_items > 1)
        cpu_pool_run(p, lin_worker, &j);
    else
        lin_worker(&j, 0, 1);
}
#else
void cpu_lin_run(cpu_pool *p, const cpu_lin *l, const float *bias, const float *x, int T, float *y,
                 int epi, void *scratch) {
    (void)p, (void)l, (void)bias, (void)x, (void)T, (void)y, (void)epi, (void)scratch;
}
#endif
