/* bench_matmul.c — cpu_matmul throughput per weight type and batch size n, for each SIMD
 * level against the scalar level, measured in the same run.
 *
 *   build-x/bench_kernels [threads] [rows cols] [seconds_per_case]
 *
 * Prints one line per (type, n): GFLOP/s (2·rows·cols·n per product) of the scalar level and
 * of every SIMD level the CPU has, each level's ratio to scalar, and each level's figure as a
 * fraction of that level's peak measured here first (float FMA for float weights, 8-bit
 * multiply-adds for quantized ones: the kernels' arithmetic on activations quantized to
 * int8). Default shape is SmolLM2-135M's FFN up-projection (1536 × 576); the K-quants need
 * cols a multiple of 256 (`bench_kernels 1 640 2048`, Gemma 3 270M's FFN down). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_weights.h"
#include "common/dtype.h"
#include "kernels/cpu/cpu_ops.h"

/* With one thread, CPU time of the process: the machine this runs on is shared, and CPU
 * time measures the kernel rather than the neighbours. With more threads, wall time. */
static clockid_t g_clock = CLOCK_MONOTONIC;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

/* Random weights with small, valid half scales at every 16-bit field a block type uses. */
static void *make_weights(int t, int rows, int cols) {
    size_t n = md_type_row_bytes(t, cols) * (size_t)rows;
    uint8_t *w = malloc(n);
    if (w)
        bench_random_weights(t, w, n, rnd);
    return w;
}

/* ---- measured peak of this CPU, one thread: what the kernels' figures are a fraction of.
 * Integer peaks count 2 ops per 8-bit multiply-add, as the GFLOP/s of the quantized products
 * do. 10 independent accumulators hide each instruction's latency. ---- */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_ITERS 2000000
#define PEAK_ACC 10

/* One peak loop: PEAK_ACC independent accumulators of OP(acc), each op counted as OPS. */
#define PEAK_LOOP(VEC, ZERO, OP, OPS, KEEP)                                                        \
    VEC acc[PEAK_ACC];                                                                             \
    for (int k = 0; k < PEAK_ACC; k++)                                                             \
        acc[k] = ZERO;                                                                             \
    double t0 = now_s();                                                                           \
    for (int i = 0; i < PEAK_ITERS; i++) {                                                         \
        _Pragma("GCC unroll 12") for (int k = 0; k < PEAK_ACC; k++) acc[k] = OP(acc[k]);           \
        __asm__ volatile("" : KEEP);                                                               \
    }                                                                                              \
    double el = now_s() - t0;                                                                      \
    for (int k = 1; k < PEAK_ACC; k++)                                                             \
        __asm__ volatile("" : : "x"(acc[k]));                                                     \
    return (double)PEAK_ITERS * PEAK_ACC * (OPS) / el / 1e9;

/* AVX2 level: 8-bit products as the AVX2 kernels do them, maddubs then madd into int32
 * (32 multiply-adds per step); float: 256-bit FMA. */
__attribute__((target("avx2,fma"))) static double peak_avx2_int(void) {
    __m256i u = _mm256_set1_epi8(3), v = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
#define OP(a) _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), one))
    PEAK_LOOP(__m256i, _mm256_setzero_si256(), OP, 64, "+x"(u))
#undef OP
}
__attribute__((target("avx2,fma"))) static double peak_avx2_float(void) {
    __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
#define OP(a) _mm256_fmadd_ps(x, y, a)
    PEAK_LOOP(__m256, _mm256_setzero_ps(), OP, 16, "+x"(x))
#undef OP
}

/* AVX-512 VNNI level: dpbusd (64 multiply-adds); float: 512-bit FMA. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double peak_avx512_int(void) {
    __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
#define OP(a) _mm512_dpbusd_epi32(a, u, v)
    PEAK_LOOP(__m512i, _mm512_setzero_si512(), OP, 128, "+v"(u))
#undef OP
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double peak_avx512_float(void) {
    __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
#define OP(a) _mm512_fmadd_ps(x, y, a)
    PEAK_LOOP(__m512, _mm512_setzero_ps(), OP, 32, "+v"(x))
#undef OP
}

/* AMX int8 (matmul_amx.c's tiles): TDPBSUD on full 16 x 64-byte tiles into 4 independent C
 * tiles, 16·16·64 multiply-adds each. The tile configuration is this function's: it tells the
 * kernels' per-thread record (cpu_amx_cfg_loaded) that theirs is no longer loaded. */
extern _Thread_local const void *cpu_amx_cfg_loaded;
typedef struct {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} peak_tilecfg;
__attribute__((target("amx-tile,amx-int8"))) static double peak_amx_int(void) {
    peak_tilecfg c = {.palette = 1};
    for (int i = 0; i < 6; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    static int8_t a[1024], b[1024];
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    cpu_amx_cfg_loaded = NULL;
    _tile_loadconfig(&c);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const int iters = PEAK_ITERS / 4;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
        _tile_dpbsud(0, 4, 5);
        _tile_dpbsud(1, 4, 5);
        _tile_dpbsud(2, 4, 5);
        _tile_dpbsud(3, 4, 5);
    }
    double el = now_s() - t0;
    _tile_release();
    return (double)iters * 4 * 16 * 16 * 64 * 2 / el / 1e9;
}
#endif

/* peak[level][0] float, [1] 8-bit integer, GFLOP/s of one thread; 0 where unmeasured. */
static void measure_peaks(int best, double peak[3][2]) {
    memset(peak, 0, sizeof(double) * 6);
#if defined(__x86_64__) && defined(__GNUC__)
    clockid_t keep = g_clock;
    g_clock = CLOCK_PROCESS_CPUTIME_ID;
    if (best >= 1) {
        peak[1][0] = peak_avx2_float();
        peak[1][1] = peak_avx2_int();
    }
    if (best >= 2) {
        peak[2][0] = peak_avx512_float();
        peak[2][1] = peak_avx512_int();
    }
    g_clock = keep;
#else
    (void)best;
#endif
}

/* GFLOP/s of cpu_matmul (wt: a weight type or CPU_PACKED of one) at the level in use. */
static double measure(cpu_pool *pool, int wt, const void *W, int rows, int cols, const float *x,
                      int n, float *y, void *scratch, double secs) {
    cpu_matmul(pool, wt, W, rows, cols, x, n, y, scratch);
    int reps = 0;
    double t0 = now_s(), el;
    do {
        cpu_matmul(pool, wt, W, rows, cols, x, n, y, scratch);
        reps++;
        el = now_s() - t0;
    } while (el < secs);
    return 2.0 * rows * cols * (double)n * reps / el / 1e9;
}

/* GFLOP/s of cpu_lin_run (the packed float products of enc_gemm.c) over l. */
static double measure_lin(cpu_pool *pool, const cpu_lin *l, int rows, int cols, const float *x,
                          int n, float *y, void *scratch, double secs) {
    cpu_lin_run(pool, l, NULL, x, n, y, CPU_LIN_SET, scratch);
    int reps = 0;
    double t0 = now_s(), el;
    do {
        cpu_lin_run(pool, l, NULL, x, n, y, CPU_LIN_SET, scratch);
        reps++;
        el = now_s() - t0;
    } while (el < secs);
    return 2.0 * rows * cols * (double)n * reps / el / 1e9;
}

/* Lines BF16/lin (CPU_LIN_WBF16: x in F32, F32 FMAs) and BF16/amx or BF16/dp (CPU_LIN_BF16: x
 * rounded too, AMX tiles where cpu_lin_amx_ok, else VDPBF16PS): what the CPU backend runs for a
 * decoder's BF16 weights at the AVX-512 level (the latter where cpu_lin_bf16_fast); the lower
 * levels keep the plain layout: nan. */
static void bench_lin(cpu_pool *pool, int threads, int rows, int cols, const int *ns, int n_ns,
                      const double *bf16, double peak, double secs) {
    uint16_t *W = make_weights(MD_TYPE_BF16, rows, cols);
    for (int prec = CPU_LIN_WBF16; prec >= CPU_LIN_BF16; prec--) {
        cpu_lin *l = cpu_lin_pack(MD_TYPE_BF16, W, rows, cols, prec);
        if (!l)
            continue;
        void *scratch = malloc(cpu_lin_scratch_size(cols, threads));
        for (int ni = 0; ni < n_ns; ni++) {
            int n = ns[ni];
            float *x = malloc(sizeof(float) * (size_t)n * cols);
            float *y = malloc(sizeof(float) * (size_t)n * rows);
            for (int i = 0; i < n * cols; i++)
                x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            double g = measure_lin(pool, l, rows, cols, x, n, y, scratch, secs);
            const char *label = prec == CPU_LIN_WBF16 ? "BF16/lin"
                                : cpu_lin_amx_ok()    ? "BF16/amx"
                                                      : "BF16/dp";
            printf("%-6s %5d %10s %10s %8s %5s %10.2f %8s %4.0f%%", label, n, "nan", "nan", "", "",
                   g, "", 100.0 * g / (peak * threads));
            if (bf16[ni] > 0)
                printf(" %6.2fx", g / bf16[ni]);
            printf("\n");
            fflush(stdout);
            free(x);
            free(y);
        }
        free(scratch);
        cpu_lin_free(l);
    }
    free(W);
}

static int is_float_type(int t) {
    return t == MD_TYPE_F32 || t == MD_TYPE_F16 || t == MD_TYPE_BF16;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int rows = argc > 3 ? atoi(argv[2]) : 1536, cols = argc > 3 ? atoi(argv[3]) : 576;
    double secs = argc > 4 ? atof(argv[4]) : 0.3;
    static const int types[] = {MD_TYPE_Q4_1, MD_TYPE_Q8_0, MD_TYPE_Q4_0, MD_TYPE_Q5_0,
                                MD_TYPE_Q4_K, MD_TYPE_Q5_K, MD_TYPE_Q6_K, MD_TYPE_F16,
                                MD_TYPE_BF16, MD_TYPE_F32};
    static const int ns[] = {1, 4, 8, 16, 64, 256, 4096};
#define N_NS (int)(sizeof ns / sizeof ns[0])
    if (threads == 1)
        g_clock = CLOCK_PROCESS_CPUTIME_ID;
    const char *only = getenv("BENCH_TYPE"); /* e.g. BENCH_TYPE=Q4_1 */
    cpu_pool *pool = cpu_pool_create(threads);
    if (!pool) {
        fprintf(stderr, "bench_kernels: cannot start %d threads\n", threads);
        return 1;
    }
    int best = cpu_simd_detect();
    printf("# cpu_matmul %d x %d, %d thread(s), best SIMD level %d; GFLOP/s per %s second\n", rows,
           cols, threads, best, threads == 1 ? "CPU" : "wall");
    double peak[3][2];
    measure_peaks(best, peak);
    printf("# measured peak per thread (GFLOP/s; 8-bit: 2 ops per multiply-add): avx2 float %.1f "
           "int8 %.1f, avx512vnni float %.1f int8 %.1f; %%pk = a figure over its level's peak "
           "(float or int8 by weight type) times the threads\n",
           peak[1][0], peak[1][1], peak[2][0], peak[2][1]);
    /* AMX (packed types, n >= 16): the avx512vnni column of a /p line runs with AMX off; the
     * amx column with it on, over the AMX int8 peak */
    double peak_amx = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (best >= 2 && cpu_amx_detect()) {
        clockid_t keep = g_clock;
        g_clock = CLOCK_PROCESS_CPUTIME_ID;
        peak_amx = peak_amx_int();
        g_clock = keep;
        printf("# AMX int8 peak per thread (TDPBSUD, full tiles): %.1f GFLOP/s; amx = the /p "
               "product with AMX tiles (n >= 16), x = over avx512vnni\n",
               peak_amx);
    } else {
        printf("# no AMX on this CPU/OS: no amx column\n");
    }
#endif
    /* BF16 at the best level first: every line's last column is its ratio to it (the issue's
     * bar: a quantized product at least as fast as the BF16 one of the same shape) */
    double bf16[N_NS] = {0};
    if (cpu_matmul_check(MD_TYPE_BF16, cols) == 0) {
        void *W = make_weights(MD_TYPE_BF16, rows, cols);
        for (int ni = 0; ni < N_NS; ni++) {
            float *x = calloc((size_t)ns[ni] * cols, sizeof(float));
            float *y = malloc(sizeof(float) * (size_t)ns[ni] * rows);
            cpu_simd_set(best);
            bf16[ni] = measure(pool, MD_TYPE_BF16, W, rows, cols, x, ns[ni], y, NULL, secs);
            free(x);
            free(y);
        }
        free(W);
    }
    printf(
        "# type/p: the weights repacked at load (kernels/cpu/repack.c); a level without packed "
        "kernels runs the scalar packed one. vs_bf16: the best level over BF16's at the same n\n");
    printf("%-6s %5s %10s %10s %8s %5s %10s %8s %5s %7s%s\n", "type", "n", "scalar", "avx2",
           "ratio", "%pk", "avx512vnni", "ratio", "%pk", "vs_bf16",
           peak_amx > 0 ? "        amx       x  %pk" : "");
    for (size_t tj = 0; tj < 2 * sizeof types / sizeof types[0]; tj++) {
        int t = types[tj / 2], pk = tj % 2;
        if (pk && !cpu_pack_type(t))
            continue;
        if (cpu_matmul_check(t, cols) != 0)
            continue;
        const char *name = md_type_name(t);
        if (only && strcmp(only, name) != 0)
            continue;
        void *W = make_weights(t, rows, cols);
        if (pk) {
            void *P = aligned_alloc(64, (cpu_pack_size(t, rows, cols) + 63) / 64 * 64);
            if (!P || cpu_pack(t, W, rows, cols, P)) {
                fprintf(stderr, "bench_kernels: cannot pack %s\n", name);
                return 1;
            }
            free(W);
            W = P;
        }
        char label[16];
        snprintf(label, sizeof label, "%s%s", name, pk ? "/p" : "");
        for (int ni = 0; ni < N_NS; ni++) {
            int n = ns[ni];
            float *x = malloc(sizeof(float) * (size_t)n * cols);
            float *y = malloc(sizeof(float) * (size_t)n * rows);
            size_t ss = cpu_matmul_scratch_size(t, cols, n);
            void *scratch = ss ? aligned_alloc(64, (ss + 63) / 64 * 64) : NULL;
            for (int i = 0; i < n * cols; i++)
                x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            double gf[3] = {0, 0, 0}, gamx = 0;
            cpu_amx_set(0);
            if (peak_amx > 0 && pk && n >= 16) {
                cpu_simd_set(best);
                cpu_amx_set(1);
                gamx = measure(pool, CPU_PACKED(t), W, rows, cols, x, n, y, scratch, secs);
                cpu_amx_set(0);
            }
            for (int lvl = 0; lvl <= best; lvl++) {
                /* the scalar kernels at 1-10 GFLOP/s would take seconds per product at
                 * prompt-sized n: nan */
                if (n > 256 && lvl == 0) {
                    gf[lvl] = NAN;
                    continue;
                }
                cpu_simd_set(lvl);
                /* the scalar level is slow: give it less time */
                gf[lvl] = measure(pool, pk ? CPU_PACKED(t) : t, W, rows, cols, x, n, y, scratch,
                                  lvl == 0 ? secs / 3 : secs);
            }
            int pi = is_float_type(t) ? 0 : 1;
            double pk1 = peak[1][pi] > 0 ? 100.0 * gf[1] / (peak[1][pi] * threads) : 0;
            printf("%-6s %5d %10.2f %10.2f %7.1fx %4.0f%%", label, n, gf[0], gf[1], gf[1] / gf[0],
                   pk1);
            if (best >= 2)
                printf(" %10.2f %7.1fx %4.0f%%", gf[2], gf[2] / gf[0],
                       100.0 * gf[2] / (peak[2][pi] * threads));
            if (bf16[ni] > 0)
                printf(" %6.2fx", gf[best] / bf16[ni]);
            if (gamx > 0)
                printf(" %10.2f %6.2fx %4.0f%%", gamx, gamx / gf[best],
                       100.0 * gamx / (peak_amx * threads));
            printf("\n");
            fflush(stdout);
            free(x);
            free(y);
            free(scratch);
        }
        free(W);
    }
    cpu_simd_set(best);
    if (best >= 2 && (!only || !strcmp(only, "BF16")) && cpu_matmul_check(MD_TYPE_BF16, cols) == 0)
        bench_lin(pool, threads, rows, cols, ns, N_NS, bf16, peak[2][0], secs);
    cpu_amx_set(cpu_amx_detect());
    cpu_pool_destroy(pool);
    return 0;
}
