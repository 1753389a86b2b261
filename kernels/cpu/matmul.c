/* matmul.c — y = x · W^T for GGUF weight types: SIMD level dispatch, activation
 * quantization into caller scratch, the threaded tile driver, and the scalar reference
 * (dequantize + double dot) the tests and benchmarks compare against.
 *
 * Work split: the product is cut into (row chunk, activation chunk) items that threads
 * take from an atomic counter, so a thread slowed by another process does not hold the
 * others up. Inside an item, tiles of KR weight rows × KC activation rows: each weight
 * block is unpacked once per tile and used KC times, which is what makes batched and
 * prompt throughput higher than n separate vector products. */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quant_blocks.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SIMD level ---- */

static int g_level = -1;
static kernel_table g_tab;

int cpu_simd_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return CPU_SIMD_AVX512VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return CPU_SIMD_AVX2;
#endif
    return CPU_SIMD_SCALAR;
}

/* Merge the level's table over the lower levels' (a level may leave a type to the one
 * below it). */
static void build_table(int level) {
    const kernel_table *chain[3] = {&cpu_kernels_scalar, &cpu_kernels_avx2, &cpu_kernels_avx512};
    kernel_table t = cpu_kernels_scalar;
    for (int l = 1; l <= level; l++) {
        const kernel_table *k = chain[l];
#define TAKE(f)                                                                                    \
    if (k->f)                                                                                      \
    t.f = k->f
        TAKE(f32);
        TAKE(f16);
        TAKE(bf16);
        TAKE(q4_0);
        TAKE(q4_1);
        TAKE(q5_0);
        TAKE(q8_0);
        TAKE(q4_k);
        TAKE(q5_k);
        TAKE(q6_k);
        TAKE(p_q4_0);
        TAKE(p_q4_1);
        TAKE(p_q5_0);
        TAKE(p_q8_0);
        TAKE(p_q4_k);
        TAKE(p_q5_k);
        TAKE(p_q6_k);
        TAKE(quant32);
        TAKE(quantk);
#undef TAKE
    }
    g_tab = t;
}

/* MEDLEY_SIMD caps the level (tests run the end-to-end suite once per level, so an answer
 * that holds on one CPU's kernels only fails on every machine, not just on the machines that
 * have that level). A name the CPU lacks is warned about once and the best level is used. */
static int env_level(int best) {
    const char *s = getenv("MEDLEY_SIMD");
    if (!s || !*s)
        return best;
    static const char *const names[] = {"scalar", "avx2", "avx512vnni"};
    int want = -1;
    for (int l = 0; l < 3; l++)
        if (!strcmp(s, names[l]))
            want = l;
    if (!strcmp(s, "avx512"))
        want = CPU_SIMD_AVX512VNNI;
    if (want < 0)
        fprintf(stderr, "medley: MEDLEY_SIMD=%s is not scalar, avx2 or avx512vnni; using %s\n", s,
                names[best]);
    else if (want > best)
        fprintf(stderr, "medley: MEDLEY_SIMD=%s: this CPU has at most %s; using %s\n", s,
                names[best], names[best]);
    return want < 0 || want > best ? best : want;
}

__attribute__((constructor)) static void simd_init(void) {
    if (g_level < 0) {
        g_level = env_level(cpu_simd_detect());
        build_table(g_level);
    }
}

int cpu_simd_level(void) {
    if (g_level < 0)
        simd_init();
    return g_level;
}

const char *cpu_simd_name(void) {
    switch (cpu_simd_level()) {
    case CPU_SIMD_AVX512VNNI: return "avx512vnni";
    case CPU_SIMD_AVX2: return "avx2";
    default: return "scalar";
    }
}

int cpu_simd_set(int level) {
    if (level < CPU_SIMD_SCALAR || level > cpu_simd_detect())
        return -1;
    g_level = level;
    build_table(level);
    return 0;
}

/* ---- types ---- */

int cpu_weight_type(int t) {
    return md_type_supported(t) || t == MD_TYPE_Q5_0 || t == MD_TYPE_Q5_K;
}

/* A packed weight type (CPU_PACKED) stands for its block type in everything but the tile
 * kernel: the activations, the scratch and the checks are the block type's. */
static int is_packed(int t) { return (t & ~0xff) == 0x100 && cpu_pack_type(t & 0xff); }
static int base_type(int t) { return is_packed(t) ? t & 0xff : t; }

int cpu_matmul_check(int t, int cols) {
    t = base_type(t);
    int bs = cpu_weight_type(t) ? md_type_block(t) : 0;
    return bs > 0 && cols > 0 && cols % bs == 0 ? 0 : -1;
}

/* ---- activation scratch ---- */

static size_t round64(size_t x) { return (x + 63) & ~(size_t)63; }

static int is_k(int t) {
    t = base_type(t);
    return t == MD_TYPE_Q4_K || t == MD_TYPE_Q5_K || t == MD_TYPE_Q6_K;
}
static int is_float(int t) {
    t = base_type(t);
    return t == MD_TYPE_F32 || t == MD_TYPE_F16 || t == MD_TYPE_BF16;
}

/* Bytes of one quantized activation row, and where its parts start. */
static size_t act_row_bytes(int t, int cols) {
    if (is_k(t))
        return round64((size_t)cols + (size_t)(cols / QK_K) * 4 + (size_t)(cols / 16) * 2);
    return round64((size_t)cols + (size_t)(cols / QK32) * 8);
}

static act_row act_at(const uint8_t *scratch, int t, int cols, int i) {
    const uint8_t *base = scratch + (size_t)i * act_row_bytes(t, cols);
    act_row a;
    a.q = (const int8_t *)base;
    if (is_k(t)) {
        a.d = (const float *)(base + cols);
        a.s = NULL;
        a.bsum = (const int16_t *)(base + cols + (size_t)(cols / QK_K) * 4);
    } else {
        a.d = (const float *)(base + cols);
        a.s = a.d + cols / QK32;
        a.bsum = NULL;
    }
    return a;
}

size_t cpu_matmul_scratch_size(int t, int cols, int n) {
    t = base_type(t);
    if (!cpu_weight_type(t) || is_float(t) || cols <= 0 || n <= 0)
        return 0;
    return (size_t)n * act_row_bytes(t, cols);
}

/* ---- driver ---- */

/* One weight of a product: its tile kernel (pfn for a packed weight, whose wstride is then
 * the bytes of one group of CPU_PACK_ROWS rows), rows and output. Its row chunks are items
 * [chunk0, chunk0 + n_chunks) of each activation chunk. */
typedef struct {
    tile_fn fn;
    ptile_fn pfn;
    int ptype; /* packed: the block type (the AMX kernel's); else 0 */
    const uint8_t *W;
    size_t wstride;
    int rows, nb, chunk0, n_chunks;
    float *y;
} mm_seg;

typedef struct {
    mm_seg seg[CPU_MM_MAX];
    int n_seg, mode;
    int wtype, cols, n; /* wtype: any weight type of the job's activation class */
    const float *x;
    uint8_t *scratch;
    int row_chunk, act_chunk, n_row_chunks, n_items;
    int amx; /* packed segments take full tiles of 16 activation rows to the AMX kernel */
    atomic_int next;
} mm_job;

static void quantize_rows(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    int per = (j->n + nth - 1) / nth, i0 = ith * per, i1 = i0 + per < j->n ? i0 + per : j->n;
    for (int i = i0; i < i1; i++) {
        act_row a = act_at(j->scratch, j->wtype, j->cols, i);
        const float *xr = j->x + (size_t)i * j->cols;
        if (is_k(j->wtype))
            g_tab.quantk(xr, j->cols, (int8_t *)a.q, (float *)a.d, (int16_t *)a.bsum);
        else
            g_tab.quant32(xr, j->cols, (int8_t *)a.q, (float *)a.d, (float *)a.s);
    }
}

/* Rows [r0, r1) of segment sg against activations [c0, c1). SET writes y; ACC adds a tile
 * computed aside (y += t, the same sum as a separate add); SWIGLU (segment 0 is the gate,
 * 1 the up projection of the same rows) writes both products, then silu(g) * u into
 * segment 0's y over the whole row range with the vector routine the unfused op uses. */
/* Rows [r0, r1) (r0 a multiple of CPU_PACK_ROWS) of packed segment g against activations
 * c0.. (acts, nc rows): one group's blocks stay in L1 while the activation tiles pass. */
static void mm_packed(const mm_job *j, const mm_seg *g, int r0, int r1, const act_row *acts, int c0,
                      int nc) {
    /* AMX: the whole tiles of 16 (the same bits as the VNNI kernel takes the rest) */
    int na = j->amx ? nc / 16 * 16 : 0;
    for (int r = r0; r < r1; r += CPU_PACK_ROWS) {
        int nr = r1 - r < CPU_PACK_ROWS ? r1 - r : CPU_PACK_ROWS;
        const uint8_t *wg = g->W + (size_t)(r / CPU_PACK_ROWS) * g->wstride;
        if (na)
            cpu_amx_ptile(g->ptype, g->nb, wg, nr, acts, act_row_bytes(j->wtype, j->cols), na,
                          g->y + (size_t)c0 * g->rows + r, (size_t)g->rows, j->mode == CPU_MM_ACC);
        for (int c = na; c < nc; c += KCP)
            g->pfn(g->nb, wg, nr, acts + c, nc - c < KCP ? nc - c : KCP,
                   g->y + (size_t)(c0 + c) * g->rows + r, (size_t)g->rows, j->mode == CPU_MM_ACC);
    }
}

static void mm_range(const mm_job *j, const mm_seg *sg, int r0, int r1, int c0, int c1) {
    /* every activation row of the item located once, not once per row tile (c1 - c0 <= 64,
     * the activation chunk) */
    act_row acts_all[64];
    const float *xf_all[64];
    int quant = !is_float(j->wtype);
    float tmp[KC * KR];
    for (int c = c0; c < c1; c++) {
        if (quant)
            acts_all[c - c0] = act_at(j->scratch, j->wtype, j->cols, c);
        else
            xf_all[c - c0] = j->x + (size_t)c * j->cols;
    }
    int n_s = j->mode == CPU_MM_SWIGLU ? 2 : 1, plain = 0;
    for (int s = 0; s < n_s; s++) {
        if (sg[s].pfn)
            mm_packed(j, &sg[s], r0, r1, acts_all, c0, c1 - c0);
        else
            plain = 1;
    }
    for (int r = r0; plain && r < r1; r += KR) {
        int nr = r1 - r < KR ? r1 - r : KR;
        for (int c = c0; c < c1; c += KC) {
            int nc = c1 - c < KC ? c1 - c : KC;
            const act_row *acts = acts_all + (c - c0);
            const float *const *xf = xf_all + (c - c0);
            for (int s = 0; s < n_s; s++) {
                const mm_seg *g = sg + s;
                if (g->pfn)
                    continue;
                const uint8_t *w = g->W + (size_t)r * g->wstride;
                float *y = g->y + (size_t)c * g->rows + r;
                if (j->mode != CPU_MM_ACC) {
                    g->fn(g->nb, w, g->wstride, nr, acts, xf, nc, y, (size_t)g->rows);
                    continue;
                }
                g->fn(g->nb, w, g->wstride, nr, acts, xf, nc, tmp, KR);
                for (int k = 0; k < nc; k++)
                    for (int i = 0; i < nr; i++)
                        y[(size_t)k * g->rows + i] += tmp[k * KR + i];
            }
        }
    }
    if (j->mode == CPU_MM_SWIGLU)
        for (int c = c0; c < c1; c++) {
            float *g = sg[0].y + (size_t)c * sg[0].rows, *u = sg[1].y + (size_t)c * sg[1].rows;
            cpu_swiglu(g + r0, g + r0, u + r0, r1 - r0);
        }
}

static void mm_worker(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    (void)ith;
    (void)nth;
    for (;;) {
        int item = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (item >= j->n_items)
            return;
        int chunk = item % j->n_row_chunks, ac = item / j->n_row_chunks;
        int s = 0;
        while (chunk >= j->seg[s].chunk0 + j->seg[s].n_chunks)
            s++;
        const mm_seg *sg = &j->seg[s];
        int r0 = (chunk - sg->chunk0) * j->row_chunk;
        int r1 = r0 + j->row_chunk < sg->rows ? r0 + j->row_chunk : sg->rows;
        int c0 = ac * j->act_chunk, c1 = c0 + j->act_chunk < j->n ? c0 + j->act_chunk : j->n;
        mm_range(j, sg, r0, r1, c0, c1);
    }
}

static ptile_fn pick_packed(int t) {
    switch (is_packed(t) ? t & 0xff : -1) {
    case MD_TYPE_Q4_0: return g_tab.p_q4_0;
    case MD_TYPE_Q4_1: return g_tab.p_q4_1;
    case MD_TYPE_Q5_0: return g_tab.p_q5_0;
    case MD_TYPE_Q8_0: return g_tab.p_q8_0;
    case MD_TYPE_Q4_K: return g_tab.p_q4_k;
    case MD_TYPE_Q5_K: return g_tab.p_q5_k;
    case MD_TYPE_Q6_K: return g_tab.p_q6_k;
    default: return NULL;
    }
}

static tile_fn pick(int t) {
    switch (t) {
    case MD_TYPE_F32: return g_tab.f32;
    case MD_TYPE_F16: return g_tab.f16;
    case MD_TYPE_BF16: return g_tab.bf16;
    case MD_TYPE_Q4_0: return g_tab.q4_0;
    case MD_TYPE_Q4_1: return g_tab.q4_1;
    case MD_TYPE_Q5_0: return g_tab.q5_0;
    case MD_TYPE_Q8_0: return g_tab.q8_0;
    case MD_TYPE_Q4_K: return g_tab.q4_k;
    case MD_TYPE_Q5_K: return g_tab.q5_k;
    case MD_TYPE_Q6_K: return g_tab.q6_k;
    default: return NULL;
    }
}

/* Weights whose activations share one scratch layout: float, 32-block or K. */
static int act_class(int t) { return is_float(t) ? 0 : is_k(t) ? 2 : 1; }

/* One threaded product over segments of one activation class. */
static void mm_run(cpu_pool *p, const cpu_mm_seg *w, int n_w, int cols, const float *x, int n,
                   int mode, void *scratch) {
    cpu_simd_level();
    mm_job j = {.n_seg = n_w, .mode = mode, .wtype = w[0].wtype, .cols = cols, .n = n,
                .x = x, .scratch = scratch};
    /* SWIGLU walks the gate's row chunks and computes the up rows beside them. */
    int n_walk = mode == CPU_MM_SWIGLU ? 1 : n_w;
    double work = 0;
    int total_rows = 0;
    for (int i = 0; i < n_w; i++) {
        int bt = base_type(w[i].wtype);
        j.seg[i] = (mm_seg){
            .fn = pick(bt),
            .pfn = pick_packed(w[i].wtype),
            .ptype = is_packed(w[i].wtype) ? bt : 0,
            .W = w[i].W,
            .wstride = is_packed(w[i].wtype) ? cpu_pack_size(bt, CPU_PACK_ROWS, cols)
                                             : md_type_row_bytes(bt, cols),
            .rows = w[i].rows,
            .nb = is_float(bt) ? cols : cols / md_type_block(bt),
            .y = w[i].y,
        };
        work += (double)w[i].rows * cols * n;
    }
    for (int i = 0; i < n_walk; i++)
        total_rows += w[i].rows;
    int nth = cpu_pool_size(p);
    j.amx = act_class(j.wtype) == 1 && n >= CPU_AMX_MIN_N && cpu_amx_use();
    if (!is_float(j.wtype)) {
        /* Quantizing a few rows costs less than waking the pool. */
        if (nth > 1 && (size_t)n * cols >= 32768)
            cpu_pool_run(p, quantize_rows, &j);
        else
            quantize_rows(&j, 0, 1);
    }
    /* Activation chunks of 64 rows keep a chunk's quantized x in L2 while the weight tiles
     * stream past it; row chunks give each thread ~8 items to balance with. Decode-sized n
     * (memory-bound: the weights stream from DRAM once) gets two large contiguous ranges per
     * thread instead: long sequential streams, fewer claims (SmolLM2 decode at 2 threads,
     * with the AVX-512 prefetch: 138 -> 160 tok/s against 8 per thread; 1 per thread stalls
     * whenever another process takes a core). Several weights share the chunk size, sized
     * on their rows together. */
    j.act_chunk = n < 64 ? n : 64;
    int n_act_chunks = (n + j.act_chunk - 1) / j.act_chunk;
    int want = n <= 4 ? nth * 2 : nth * 8 / n_act_chunks + 1;
    int rc = (total_rows + want - 1) / want;
    /* a multiple of the packed group (and so of KR): a packed row chunk starts at a group */
    rc = (rc + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS * CPU_PACK_ROWS;
    j.row_chunk = rc;
    j.n_row_chunks = 0;
    for (int i = 0; i < n_walk; i++) {
        j.seg[i].chunk0 = j.n_row_chunks;
        j.seg[i].n_chunks = (j.seg[i].rows + rc - 1) / rc;
        j.n_row_chunks += j.seg[i].n_chunks;
    }
    j.n_items = j.n_row_chunks * n_act_chunks;
    atomic_init(&j.next, 0);
    if (nth > 1 && j.n_items > 1 && work >= 65536.0)
        cpu_pool_run(p, mm_worker, &j);
    else
        mm_worker(&j, 0, 1);
}

static int seg_ok(const cpu_mm_seg *w, int cols) {
    return w->rows > 0 && cpu_matmul_check(w->wtype, cols) == 0;
}

void cpu_matmul(cpu_pool *p, int wtype, const void *W, int rows, int cols, const float *x, int n,
                float *y, void *scratch) {
    cpu_mm_seg s = {wtype, W, rows, y};
    if (n <= 0 || !seg_ok(&s, cols))
        return;
    mm_run(p, &s, 1, cols, x, n, CPU_MM_SET, scratch);
}

void cpu_matmul_n(cpu_pool *p, const cpu_mm_seg *w, int n_w, int cols, const float *x, int n,
                  int mode, void *scratch) {
    if (n <= 0 || n_w < 1 || n_w > CPU_MM_MAX || (mode == CPU_MM_SWIGLU && n_w != 2))
        return;
    int same = 1;
    for (int i = 0; i < n_w; i++) {
        if (!seg_ok(&w[i], cols))
            return;
        same &= act_class(w[i].wtype) == act_class(w[0].wtype);
    }
    if (mode == CPU_MM_SWIGLU && w[1].rows != w[0].rows)
        return;
    if (same) {
        mm_run(p, w, n_w, cols, x, n, mode, scratch);
        return;
    }
    /* Activation classes differ (a Q6_K beside Q4_0 weights): one product per weight, each
     * quantizing x its own way into the one scratch. */
    for (int i = 0; i < n_w; i++)
        mm_run(p, &w[i], 1, cols, x, n, mode == CPU_MM_ACC ? CPU_MM_ACC : CPU_MM_SET, scratch);
    if (mode == CPU_MM_SWIGLU)
        for (int c = 0; c < n; c++) {
            float *g = w[0].y + (size_t)c * w[0].rows;
            cpu_swiglu(g, g, w[1].y + (size_t)c * w[1].rows, w[0].rows);
        }
}

/* ---- reference ---- */

void cpu_dequant_row(int t, const void *row, float *out, int cols) {
    const uint8_t *src = row;
    switch (t) {
    case MD_TYPE_F32:
        for (int i = 0; i < cols; i++)
            memcpy(&out[i], src + 4 * (size_t)i, 4);
        return;
    case MD_TYPE_F16:
    case MD_TYPE_BF16:
        for (int i = 0; i < cols; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * (size_t)i, 2);
            out[i] = t == MD_TYPE_F16 ? md_fp16_to_fp32(h) : md_bf16_to_fp32(h);
        }
        return;
    case MD_TYPE_Q4_0:
        for (int b = 0; b < cols / QK32; b++) {
            const blk_q4_0 *k = (const blk_q4_0 *)src + b;
            float d = md_fp16_to_fp32(k->d);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * ((k->qs[j] & 15) - 8);
                out[b * 32 + j + 16] = d * ((k->qs[j] >> 4) - 8);
            }
        }
        return;
    case MD_TYPE_Q4_1:
        for (int b = 0; b < cols / QK32; b++) {
            const blk_q4_1 *k = (const blk_q4_1 *)src + b;
            float d = md_fp16_to_fp32(k->d), m = md_fp16_to_fp32(k->m);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (k->qs[j] & 15) + m;
                out[b * 32 + j + 16] = d * (k->qs[j] >> 4) + m;
            }
        }
        return;
    case MD_TYPE_Q5_0:
        for (int b = 0; b < cols / QK32; b++) {
            const blk_q5_0 *k = (const blk_q5_0 *)src + b;
            float d = md_fp16_to_fp32(k->d);
            uint32_t qh = (uint32_t)k->qh[0] | (uint32_t)k->qh[1] << 8 |
                          (uint32_t)k->qh[2] << 16 | (uint32_t)k->qh[3] << 24;
            for (int j = 0; j < 16; j++) {
                int lo = (k->qs[j] & 15) | (int)(qh >> j & 1) << 4;
                int hi = (k->qs[j] >> 4) | (int)(qh >> (j + 16) & 1) << 4;
                out[b * 32 + j] = d * (lo - 16);
                out[b * 32 + j + 16] = d * (hi - 16);
            }
        }
        return;
    case MD_TYPE_Q8_0:
        for (int b = 0; b < cols / QK32; b++) {
            const blk_q8_0 *k = (const blk_q8_0 *)src + b;
            float d = md_fp16_to_fp32(k->d);
            for (int j = 0; j < 32; j++)
                out[b * 32 + j] = d * k->qs[j];
        }
        return;
    case MD_TYPE_Q4_K:
        for (int b = 0; b < cols / QK_K; b++) {
            const blk_q4_k *k = (const blk_q4_k *)src + b;
            float d = md_fp16_to_fp32(k->d), dmin = md_fp16_to_fp32(k->dmin);
            for (int s = 0; s < 8; s++) {
                int sc, mn;
                md_q4k_scale_min(k->scales, s, &sc, &mn);
                const uint8_t *qs = k->qs + (s / 2) * 32;
                for (int l = 0; l < 32; l++)
                    out[b * QK_K + s * 32 + l] =
                        d * sc * ((qs[l] >> ((s & 1) * 4)) & 15) - dmin * mn;
            }
        }
        return;
    case MD_TYPE_Q5_K:
        for (int b = 0; b < cols / QK_K; b++) {
            const blk_q5_k *k = (const blk_q5_k *)src + b;
            float d = md_fp16_to_fp32(k->d), dmin = md_fp16_to_fp32(k->dmin);
            for (int s = 0; s < 8; s++) {
                int sc, mn;
                md_q4k_scale_min(k->scales, s, &sc, &mn);
                const uint8_t *qs = k->qs + (s / 2) * 32;
                for (int l = 0; l < 32; l++) {
                    int q = ((qs[l] >> ((s & 1) * 4)) & 15) | ((k->qh[l] >> s) & 1) << 4;
                    out[b * QK_K + s * 32 + l] = d * sc * q - dmin * mn;
                }
            }
        }
        return;
    case MD_TYPE_Q6_K:
        for (int b = 0; b < cols / QK_K; b++) {
            const blk_q6_k *k = (const blk_q6_k *)src + b;
            float d = md_fp16_to_fp32(k->d);
            for (int e = 0; e < QK_K; e++) {
                int h = e / 128, gg = (e % 128) / 32, l = e % 32;
                int lo = (k->ql[64 * h + (gg & 1) * 32 + l] >> ((gg >> 1) * 4)) & 15;
                int hi = (k->qh[32 * h + l] >> (2 * gg)) & 3;
                out[b * QK_K + e] = d * k->scales[e / 16] * ((lo | (hi << 4)) - 32);
            }
        }
        return;
    default:
        for (int i = 0; i < cols; i++)
            out[i] = NAN;
    }
}

/* Rows [r0, r1) of the reference product, wr a row of cols floats. */
static void ref_rows(int t, const void *W, int rows, int cols, const float *x, int n, float *y,
                     int r0, int r1, float *wr) {
    size_t rs = md_type_row_bytes(t, cols);
    for (int r = r0; r < r1; r++) {
        cpu_dequant_row(t, (const uint8_t *)W + (size_t)r * rs, wr, cols);
        for (int c = 0; c < n; c++) {
            double s = 0;
            for (int i = 0; i < cols; i++)
                s += (double)wr[i] * x[(size_t)c * cols + i];
            y[(size_t)c * rows + r] = (float)s;
        }
    }
}

/* Rows [r0, r1) as NaN: the reference's answer when it cannot allocate its row. */
static void ref_nan(int rows, int n, float *y, int r0, int r1) {
    for (int c = 0; c < n; c++)
        for (int r = r0; r < r1; r++)
            y[(size_t)c * rows + r] = NAN;
}

void cpu_matmul_ref(int t, const void *W, int rows, int cols, const float *x, int n, float *y) {
    if (rows <= 0 || n <= 0 || cpu_matmul_check(t, cols) != 0)
        return;
    float *wr = malloc((size_t)cols * sizeof *wr);
    if (!wr)
        ref_nan(rows, n, y, 0, rows);
    else
        ref_rows(t, W, rows, cols, x, n, y, 0, rows, wr);
    free(wr);
}

typedef struct {
    int t, rows, cols, n;
    const void *W;
    const float *x;
    float *y;
} ref_job;

static void ref_part(void *ctx, int ith, int nth) {
    const ref_job *j = ctx;
    int per = (j->rows + nth - 1) / nth, r0 = ith * per, r1 = r0 + per < j->rows ? r0 + per : j->rows;
    if (r0 >= r1)
        return;
    float *wr = malloc((size_t)j->cols * sizeof *wr);
    if (!wr)
        ref_nan(j->rows, j->n, j->y, r0, r1);
    else
        ref_rows(j->t, j->W, j->rows, j->cols, j->x, j->n, j->y, r0, r1, wr);
    free(wr);
}

void cpu_matmul_ref_mt(cpu_pool *p, int t, const void *W, int rows, int cols, const float *x,
                       int n, float *y) {
    if (rows <= 0 || n <= 0 || cpu_matmul_check(t, cols) != 0)
        return;
    ref_job j = {t, rows, cols, n, W, x, y};
    cpu_pool_run(p, ref_part, &j);
}
