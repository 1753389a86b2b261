/* matmul_amx.c — AMX int8 tile kernels for the repacked 32-element block types (Q4_0, Q4_1,
 * Q5_0, Q8_0; repack.c's layout), used for products of at least CPU_AMX_MIN_N activation rows
 * where the CPU and the OS allow AMX (cpu_amx_use), and the detection, the per-process
 * permission and the switch (cpu_amx_set, MEDLEY_AMX=0).
 *
 * One TDPBSUD per 32-block: C[16 tokens × 16 weight rows] (int32) = A[16 tokens × 32 bytes]
 * (the signed quantized activations, read in place from matmul scratch: row stride
 * act_row_bytes) · B[8 × 64 bytes] (unsigned weights, 4 consecutive elements of each of the
 * 16 rows per 64-byte row: exactly one packed record part, Q8_0's as it is, the nibble
 * types' unpacked to one byte per element into an L1 buffer once per call). A row of C is
 * then one token's int32 dot for the 16 rows of the group, the lane order of the AVX-512
 * packed kernel (matmul_avx512.c pk_main), and the fold is that kernel's, instruction for
 * instruction:
 *   acc_c = fma(cvt(C[c]), dw · dx_c, acc_c);  acc_c = fma(mw, s_c, acc_c)
 * per block in block order. The integer sums are exact, so every output is the same bits as
 * the VNNI kernel's for any n: products below the crossover (decode), the tokens of a chunk
 * that do not fill a tile of 16, and AMX-less machines run VNNI and agree bit for bit
 * (the engine's chunked prefill needs a token's bits independent of its chunk). */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__) &&                                                   \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define HAVE_AMX 0
#endif

_Thread_local const void *cpu_amx_cfg_loaded; /* quant_blocks.h */

/* -1 not probed yet; then 0/1. */
static atomic_int g_amx_hw = -1;
static atomic_int g_amx_on = -1;

#if HAVE_AMX
/* CPUID.7.0:EDX bit 24 AMX-TILE, bit 25 AMX-INT8; the OS saves tile state (XCR0 bits 17, 18);
 * Linux >= 5.16 grants the 8 KiB tile data per process on request (ARCH_REQ_XCOMP_PERM). */
static int amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & 1u << 24) || !(d & 1u << 25))
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & 1u << 27)) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 3u << 17) != 3u << 17)
        return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#else
static int amx_probe(void) {
    return 0;
}
#endif

int cpu_amx_detect(void) {
    int v = atomic_load_explicit(&g_amx_hw, memory_order_acquire);
    if (v < 0) {
        v = amx_probe(); /* idempotent: two threads racing both ask, both get the answer */
        atomic_store_explicit(&g_amx_hw, v, memory_order_release);
    }
    return v;
}

static int amx_on(void) {
    int v = atomic_load_explicit(&g_amx_on, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("MEDLEY_AMX");
        v = cpu_amx_detect() && !(e && !strcmp(e, "0"));
        atomic_store_explicit(&g_amx_on, v, memory_order_relaxed);
    }
    return v;
}

int cpu_amx_set(int on) {
    if (on && !cpu_amx_detect())
        return -1;
    atomic_store_explicit(&g_amx_on, on ? 1 : 0, memory_order_relaxed);
    return 0;
}

int cpu_amx_use(void) {
    return cpu_simd_level() == CPU_SIMD_AVX512VNNI && amx_on();
}

#if HAVE_AMX
#define TGT __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;
_Static_assert(sizeof(tilecfg) == 64, "LDTILECFG reads 64 bytes");

/* tmm0, tmm1: C (16 tokens × 16 int32); tmm2, tmm3: A (16 tokens × 32 bytes); tmm4, tmm5: B
 * (8 × 64 bytes). Two of each, for consecutive blocks: one multiplies while the other's C is
 * stored. */
static const tilecfg g_cfg = {
    .palette = 1,
    .colsb = {64, 64, 32, 32, 64, 64},
    .rows = {16, 16, 16, 16, 8, 8},
};

TGT static void cfg_load(void) {
    if (cpu_amx_cfg_loaded != &g_cfg) {
        _tile_loadconfig(&g_cfg);
        cpu_amx_cfg_loaded = &g_cfg;
    }
}

/* Blocks unpacked per pass: 32 × 512 bytes of B (16 KiB) beside the 16 tokens' A bytes. */
#define BCH 32

/* Blocks [b0, b0 + n) of a nibble-type group unpacked into buf (512 bytes per block: the B
 * tile, row g = elements 4g..4g+3 of each of the 16 rows, Q5_0's fifth bit added). */
TGT static INL void unpack_b(int T, const uint8_t *wg, int b0, int n, uint8_t *buf) {
    const size_t pb = pk_block_bytes(T);
    const __m512i m4 = _mm512_set1_epi8(15), h16 = _mm512_set1_epi8(16);
    for (int i = 0; i < n; i++) {
        const uint8_t *rec = wg + (size_t)(b0 + i) * pb;
        uint8_t *o = buf + (size_t)i * 512;
        for (int k = 0; k < 4; k++) {
            __m512i z = _mm512_loadu_si512((const void *)(rec + 64 * k));
            __m512i lo = _mm512_and_si512(z, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            if (T == MD_TYPE_Q5_0) {
                uint64_t ml, mh;
                memcpy(&ml, rec + 256 + 8 * (2 * k), 8);
                memcpy(&mh, rec + 256 + 8 * (2 * k + 1), 8);
                lo = _mm512_mask_add_epi8(lo, (__mmask64)ml, lo, h16);
                hi = _mm512_mask_add_epi8(hi, (__mmask64)mh, hi, h16);
            }
            _mm512_store_si512((void *)(o + 128 * k), lo);
            _mm512_store_si512((void *)(o + 128 * k + 64), hi);
        }
    }
}

/* acc[c] += block b's C tile (cb) folded with pk_main's arithmetic. */
TGT static INL void fold(__m512 *acc, const int32_t *cb, __m512 dw, __m512 mw, const uint8_t *dp,
                         size_t qs, size_t soff) {
    #pragma GCC unroll 16
    for (int c = 0; c < 16; c++) {
        const uint8_t *dc = dp + c * qs; /* token c's d[b]; its s[b] soff bytes on */
        float dx, sx;
        memcpy(&dx, dc, 4);
        memcpy(&sx, dc + soff, 4);
        __m512 f = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * c)));
        acc[c] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[c]);
        acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc[c]);
    }
}

TGT static INL void amx_main(int T, int nb, const uint8_t *wg, int nr, const act_row *a,
                             size_t qstride, int nc, float *y, size_t ldy, int add) {
    const size_t pb = pk_block_bytes(T), doff = pk_d_off(T);
    const float off = T == MD_TYPE_Q4_0   ? 8.0f
                      : T == MD_TYPE_Q5_0 ? 16.0f
                      : T == MD_TYPE_Q8_0 ? 128.0f
                                          : 0.0f;
    const __m512 noff = _mm512_set1_ps(-off);
    _Alignas(64) uint8_t bbuf[BCH * 512]; /* unused by Q8_0, whose records are B tiles */
    _Alignas(64) int32_t cbuf[2][256];
    _Alignas(64) float accm[64][16]; /* tokens [t, t + 16) of the 64 between passes */
    cfg_load();
    for (int t0 = 0; t0 < nc; t0 += 64) { /* nc <= 64 from the driver; any multiple of 16 works */
        int tn = nc - t0 < 64 ? nc - t0 : 64;
        for (int b0 = 0; b0 < nb; b0 += BCH) {
            int bn = nb - b0 < BCH ? nb - b0 : BCH;
            if (T != MD_TYPE_Q8_0)
                unpack_b(T, wg, b0, bn, bbuf);
            for (int t = 0; t < tn; t += 16) {
                const act_row *at = a + t0 + t;
                /* the rows' d and s, like q, qstride bytes apart (matmul scratch) */
                const uint8_t *dp0 = (const uint8_t *)at[0].d;
                const size_t soff = (size_t)((const uint8_t *)at[0].s - dp0);
                __m512 acc[16];
                #pragma GCC unroll 16
                for (int c = 0; c < 16; c++)
                    acc[c] = b0 ? _mm512_load_ps(accm[t + c]) : _mm512_setzero_ps();
                /* software-pipelined: step i stores block i's C, issues block i + 1's tile
                 * product and folds block i - 1 (stored a step earlier) while the tile unit
                 * works; the fold's float work is the limit (docs/kernels.md "AMX tiles") */
#define ISSUE(CT, AT, BT, i)                                                                       \
    do {                                                                                           \
        int b_ = b0 + (i);                                                                         \
        _tile_loadd(AT, at[0].q + (size_t)b_ * QK32, (long)qstride);                               \
        _tile_loadd(BT,                                                                            \
                    T == MD_TYPE_Q8_0 ? (const void *)(wg + (size_t)b_ * pb)                       \
                                      : (const void *)(bbuf + (size_t)(i) * 512),                  \
                    64);                                                                           \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
    } while (0)
                ISSUE(0, 2, 4, 0);
                for (int i = 0; i <= bn; i++) {
                    if (i < bn) {
                        if (i & 1) {
                            _tile_stored(1, cbuf[1], 64);
                            if (i + 1 < bn)
                                ISSUE(0, 2, 4, i + 1);
                        } else {
                            _tile_stored(0, cbuf[0], 64);
                            if (i + 1 < bn)
                                ISSUE(1, 3, 5, i + 1);
                        }
                    }
                    if (i == 0)
                        continue;
                    /* block i - 1, stored a step ago: its store has drained meanwhile */
                    int k = i - 1;
                    const uint8_t *r0 = wg + (size_t)(b0 + k) * pb;
                    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r0 + doff)));
                    __m512 mw = T == MD_TYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                                        (const __m256i *)(r0 + doff + 32)))
                                                  : _mm512_mul_ps(dw, noff);
                    fold(acc, cbuf[k & 1], dw, mw, dp0 + 4 * (size_t)(b0 + k), qstride, soff);
                }
#undef ISSUE
                #pragma GCC unroll 16
                for (int c = 0; c < 16; c++)
                    _mm512_store_ps(accm[t + c], acc[c]);
            }
        }
        __mmask16 m = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
        for (int c = 0; c < tn; c++) {
            float *yc = y + (size_t)(t0 + c) * ldy;
            __m512 v = _mm512_load_ps(accm[c]);
            if (add)
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yc), v);
            _mm512_mask_storeu_ps(yc, m, v);
        }
    }
}

#define AMX_TILE(name, T)                                                                          \
    TGT static void name(int nb, const uint8_t *wg, int nr, const act_row *a, size_t qstride,      \
                         int nc, float *y, size_t ldy, int add) {                                  \
        amx_main(T, nb, wg, nr, a, qstride, nc, y, ldy, add);                                      \
    }
AMX_TILE(amx_q4_0, MD_TYPE_Q4_0)
AMX_TILE(amx_q4_1, MD_TYPE_Q4_1)
AMX_TILE(amx_q5_0, MD_TYPE_Q5_0)
AMX_TILE(amx_q8_0, MD_TYPE_Q8_0)
#undef AMX_TILE

void cpu_amx_ptile(int t, int nb, const uint8_t *wg, int nr, const act_row *a, size_t qstride,
                   int nc, float *y, size_t ldy, int add) {
    switch (t) {
    case MD_TYPE_Q4_0: amx_q4_0(nb, wg, nr, a, qstride, nc, y, ldy, add); break;
    case MD_TYPE_Q4_1: amx_q4_1(nb, wg, nr, a, qstride, nc, y, ldy, add); break;
    case MD_TYPE_Q5_0: amx_q5_0(nb, wg, nr, a, qstride, nc, y, ldy, add); break;
    case MD_TYPE_Q8_0: amx_q8_0(nb, wg, nr, a, qstride, nc, y, ldy, add); break;
    default: break;
    }
}
#else
void cpu_amx_ptile(int t, int nb, const uint8_t *wg, int nr, const act_row *a, size_t qstride,
                   int nc, float *y, size_t ldy, int add) {
    (void)t, (void)nb, (void)wg, (void)nr, (void)a, (void)qstride, (void)nc, (void)y, (void)ldy,
        (void)add;
}
#endif
