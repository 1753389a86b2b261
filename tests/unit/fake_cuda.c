/* fake_cuda.c — kernels/cuda's device layer imitated on the host, launches recorded (see
 * fake_cuda.h). The host logic that decides launch arguments is ctx.cu's and gemm.cu's as of
 * this writing: allocations refused while capturing, GEMV for m <= CUDA_GEMV_MAX_M (for
 * cuda_matmul_n one launch per weight type, or the gate/up SwiGLU launch), otherwise x
 * converted into scratch X (once per 16-bit type) and quantized weights read from their BF16
 * copy (cuda_mm_w.bf16) or expanded into scratch W before cuBLAS. */
#include "unit/fake_cuda.h"

#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"

#define GIB ((size_t)1 << 30)
#define FAKE_TOTAL (80 * GIB) /* what the fake device reports unless fake_cuda_set_total */
#define FAKE_SMS 132
#define PTR_SHIFT 40

enum {
    F_UPLOAD,
    F_MEMSET0,
    F_FILL_RANDOM,
    F_DEQUANT,
    F_RMSNORM,
    F_ROPE,
    F_SWIGLU,
    F_ADD,
    F_ADD_BIAS,
    F_CONVERT,
    F_GET_ROWS,
    F_GATHER,
    F_GEMV,
    F_GEMV_N,
    F_GEMV_SWIGLU,
    F_SGEMM,
    F_GEMM,
    F_KV_WRITE,
    F_ATTN_DECODE,
    F_ATTN_PREFILL,
    F_ARGMAX,
    F_SAMPLE,
    F_ROPE_KV,
    F_N
};

/* name, then each argument as name:kind (p pointer, i integer, f float, h hash) */
static const char *const fn_spec[F_N] = {
    [F_UPLOAD] = "cuda_upload dst:p bytes:i data:h",
    [F_MEMSET0] = "cuda_memset0 dst:p bytes:i",
    [F_FILL_RANDOM] = "cuda_fill_random dst:p dtype:i n:i scale:f seed:i",
    [F_DEQUANT] = "cuda_dequantize gtype:i src:p dst:p out:i n:i",
    [F_RMSNORM] = "cuda_rmsnorm x:p w:p eps:f rows:i dim:i out:p out_type:i",
    [F_ROPE] = "cuda_rope x:p pos:p n_tokens:i n_heads:i head_dim:i rot_dim:i inv_freq:p neox:i",
    [F_SWIGLU] = "cuda_swiglu gate:p up:p out:p out_type:i n:i",
    [F_ADD] = "cuda_add y:p x:p n:i",
    [F_ADD_BIAS] = "cuda_add_bias y:p bias:p rows:i cols:i",
    [F_CONVERT] = "cuda_convert x:p dst:p out_type:i n:i",
    [F_GET_ROWS] = "cuda_get_rows table:p gtype:i n_rows:i dim:i ids:p n:i out:p bad_id:p",
    [F_GATHER] = "cuda_gather_rows x:p rows:p n_rows:i cols:i out:p",
    [F_GEMV] = "gemv w:p wtype:i row_bytes:i x:p y:p m:i n:i k:i beta:f",
    /* one record per weight of a fused launch: seg of n_seg */
    [F_GEMV_N] = "gemv_n w:p wtype:i row_bytes:i x:p y:p m:i n:i k:i beta:f seg:i n_seg:i",
    [F_GEMV_SWIGLU] = "gemv_swiglu w_gate:p w_up:p wtype:i row_bytes:i x:p y:p m:i n:i k:i",
    [F_SGEMM] = "cublasSgemm w:p x:p y:p m:i n:i k:i beta:f",
    [F_GEMM] = "cublasGemmEx w:p x:p x_type:i y:p m:i n:i k:i beta:f",
    [F_KV_WRITE] = "cuda_kv_write k_cache:p v_cache:p dtype:i kv_dim:i k:p v:p slots:p n_tokens:i",
    [F_ATTN_DECODE] = "cuda_attn_decode k_cache:p v_cache:p dtype:i n_kv_heads:i head_dim:i "
                      "block_tokens:i q:p dec:p n:i block_table:p max_blocks:i n_heads:i "
                      "scale:f n_splits:i work:p out:p",
    [F_ATTN_PREFILL] = "cuda_attn_prefill k_cache:p v_cache:p dtype:i n_kv_heads:i head_dim:i "
                       "block_tokens:i q:p tiles:p n_tiles:i block_table:p max_blocks:i "
                       "n_heads:i scale:f out:p",
    [F_ARGMAX] = "cuda_argmax logits:p rows:i vocab:i out:p",
    [F_SAMPLE] = "cuda_sample logits:p rows:i vocab:i params:p pen:p pen_raw:p out:p logprob:p "
                 "top_tok:p top_lp:p",
    [F_ROPE_KV] = "cuda_rope_kv q:p k:p v:p k_cache:p v_cache:p dtype:i pos:p slots:p n_tokens:i "
                  "n_heads:i n_kv_heads:i head_dim:i rot_dim:i inv_freq:p neox:i",
};

struct cuda_ctx {
    int ordinal;
    int capturing;
    cuda_graph *cap; /* the graph being captured */
    void *scratch[2];
    size_t scratch_bytes[2];
    unsigned scratch_gen;
    md_err failed, capture_failed;
};

struct cuda_graph {
    fake_launch *l;
    size_t n, cap;
};

struct CUevent_st {
    size_t pos; /* stream length when recorded */
};

typedef struct {
    char *base;
    size_t size;
    int64_t id;
} alloc;

typedef struct {
    const void *src;
    size_t bytes;
    uint64_t hash;
    size_t pos;
} pending_copy;

static struct {
    fake_launch *stream;
    size_t n, cap;
    alloc *allocs; /* live, sorted by base */
    size_t n_allocs, cap_allocs;
    char **base_by_id; /* NULL once freed */
    size_t *size_by_id;
    int64_t next_id, cap_ids;
    size_t used;
    struct {
        void *p;
        size_t n;
    } pinned[16];
    pending_copy pending[64];
    int n_pending;
    long steps; /* cudaEventRecord calls */
    long ends;  /* cuda_graph_end calls */
    int fail_every;
    size_t total;          /* device memory; 0: FAKE_TOTAL */
    long frees_unlaunched; /* graphs freed since the last graph launch */
    int64_t slots;         /* the slots (normalised) of the latest KV store that ran, and */
    int64_t n_slots;       /* their count: where each token row's K/V went this step */
    fake_cuda_stats st;
} g = {.next_id = 1};

static size_t dev_total(void) {
    return g.total ? g.total : FAKE_TOTAL;
}
static size_t dev_free(void) {
    return dev_total() > g.used ? dev_total() - g.used : 0;
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
    if (g.st.violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g.st.first_violation, sizeof g.st.first_violation, fmt, ap);
        va_end(ap);
    }
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h ^ n;
}

/* ---- allocations ------------------------------------------------------------------ */

/* The live allocation holding p (p may be its end), or NULL. */
static alloc *find_alloc(const void *p) {
    size_t lo = 0, hi = g.n_allocs;
    while (lo < hi) { /* first allocation with base > p */
        size_t mid = (lo + hi) / 2;
        if ((const char *)p < g.allocs[mid].base)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == 0)
        return NULL;
    alloc *a = &g.allocs[lo - 1];
    return (const char *)p <= a->base + a->size ? a : NULL;
}

static void *fake_alloc(size_t bytes) {
    if (g.n_allocs == g.cap_allocs) {
        size_t cap = g.cap_allocs ? 2 * g.cap_allocs : 256;
        alloc *na = realloc(g.allocs, cap * sizeof *na);
        if (!na)
            return NULL;
        g.allocs = na;
        g.cap_allocs = cap;
    }
    if (g.next_id >= g.cap_ids) {
        int64_t cap = g.cap_ids ? 2 * g.cap_ids : 1024;
        char **nb = realloc(g.base_by_id, (size_t)cap * sizeof *nb);
        if (!nb)
            return NULL;
        g.base_by_id = nb;
        size_t *ns = realloc(g.size_by_id, (size_t)cap * sizeof *ns);
        if (!ns)
            return NULL;
        g.size_by_id = ns;
        g.cap_ids = cap;
    }
    char *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        return NULL;
    size_t i = g.n_allocs;
    while (i > 0 && g.allocs[i - 1].base > p)
        i--;
    memmove(g.allocs + i + 1, g.allocs + i, (g.n_allocs - i) * sizeof *g.allocs);
    g.allocs[i] = (alloc){p, bytes, g.next_id};
    g.n_allocs++;
    g.base_by_id[g.next_id] = p;
    g.size_by_id[g.next_id] = bytes;
    g.next_id++;
    g.used += bytes;
    return p;
}

static void fake_free(void *p) {
    alloc *a = find_alloc(p);
    if (!a || a->base != p) {
        violation("cuda_pool_free of %p, not the start of a live allocation", p);
        return;
    }
    g.base_by_id[a->id] = NULL;
    g.used -= a->size;
    free(a->base);
    size_t i = (size_t)(a - g.allocs);
    memmove(g.allocs + i, g.allocs + i + 1, (g.n_allocs - i - 1) * sizeof *g.allocs);
    g.n_allocs--;
}

/* (id << 40 | offset) of a device pointer, checking `bytes` from it lie in its allocation. */
static int64_t norm_ptr(const void *p, size_t bytes, const char *fname, const char *what) {
    if (!p)
        return 0;
    alloc *a = find_alloc(p);
    if (!a) {
        violation("%s (step %ld): %s = %p is not device memory", fname, g.steps, what, p);
        return -1;
    }
    size_t off = (size_t)((const char *)p - a->base);
    if (bytes > a->size - off)
        violation("%s (step %ld): %s reads/writes %zu bytes at offset %zu of allocation #%lld "
                  "(%zu bytes)",
                  fname, g.steps, what, bytes, off, (long long)a->id, a->size);
    return a->id << PTR_SHIFT | (int64_t)off;
}

/* The live pointer behind a normalised one (NULL when freed), and the bytes after it. */
static char *denorm(int64_t v, size_t *room) {
    if (v <= 0)
        return NULL;
    int64_t id = v >> PTR_SHIFT;
    size_t off = (size_t)(v & (((int64_t)1 << PTR_SHIFT) - 1));
    if (id >= g.next_id || !g.base_by_id[id])
        return NULL;
    *room = g.size_by_id[id] > off ? g.size_by_id[id] - off : 0;
    return g.base_by_id[id] + off;
}

/* ---- launch records ------------------------------------------------------------- */

static void rec_init(fake_launch *r, int fn) {
    memset(r, 0, sizeof *r);
    r->fn = fn;
}
static void arg_i(fake_launch *r, int64_t v) {
    r->a[r->n_args++] = v;
}
static void arg_f(fake_launch *r, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    r->a[r->n_args++] = u;
}
static void arg_p(fake_launch *r, const void *p, size_t bytes, const char *what) {
    r->a[r->n_args++] = norm_ptr(p, bytes, fake_cuda_fn_name(r->fn), what);
}

static size_t dtype_bytes(int t) {
    return t == CUDA_F32 ? 4 : 2;
}

/* Hash of n int32 at normalised pointer v (0 when not live or too short), mixed into h. */
static uint64_t mix_ints(uint64_t h, int64_t v, int64_t n) {
    size_t room = 0;
    const char *p = denorm(v, &room);
    if (!p || n < 0 || room < (size_t)n * 4)
        return h * 31 + 1;
    return h * 1099511628211ull ^ hash_bytes(p, (size_t)n * 4);
}

/* The metadata a kernel follows (see fake_launch.reads). */
static uint64_t metadata_read(const fake_launch *l) {
    size_t rb = 0;
    switch (l->fn) {
    case F_GET_ROWS: return mix_ints(7, l->a[4], l->a[5]);
    case F_ROPE: return mix_ints(11, l->a[1], l->a[2]);
    case F_KV_WRITE: return mix_ints(13, l->a[6], l->a[7]);
    case F_ROPE_KV: return mix_ints(mix_ints(29, l->a[6], l->a[8]), l->a[7], l->a[8]);
    case F_GATHER: return mix_ints(17, l->a[1], l->a[2]);
    case F_SAMPLE:
        return mix_ints(23, l->a[3], l->a[1] * (int64_t)(sizeof(cuda_sample_params) / 4));
    case F_ATTN_DECODE:
    case F_ATTN_PREFILL: {
        int dec = l->fn == F_ATTN_DECODE, w = dec ? 3 : 4;
        int64_t n = l->a[8], max_blocks = l->a[10], bt_tok = l->a[5];
        uint64_t h = mix_ints(19, l->a[7], n * w);
        size_t re = 0;
        const int32_t *ent = (const int32_t *)denorm(l->a[7], &re);
        const char *bt = denorm(l->a[9], &rb);
        if (!ent || !bt || re < (size_t)(n * w) * 4 || bt_tok < 1)
            return h;
        for (int64_t i = 0; i < n; i++) {
            const int32_t *x = ent + w * i;
            int32_t s = dec ? x[1] : x[0];
            int64_t last = dec ? x[2] - 1 : (int64_t)x[3] + x[2] - 1; /* last position read */
            int64_t nb = last / bt_tok + 1;
            if (s < 0 || nb < 1 || nb > max_blocks || ((size_t)s + 1) * max_blocks * 4 > rb)
                continue; /* execute() reports it */
            h = h * 1099511628211ull ^ hash_bytes(bt + (size_t)s * max_blocks * 4, (size_t)nb * 4);
        }
        return h;
    }
    default: return 0;
    }
}

/* An attention launch's block table at its stride against the step's KV stores: the block it
 * reads for each of its tokens' own positions is the block that token's K/V went to (slot /
 * block_tokens of the latest cuda_kv_write / cuda_rope_kv), so a block table packed at the
 * wrong stride or offset cannot pass. */
static void block_table_names_slots(const fake_launch *l) {
    int dec = l->fn == F_ATTN_DECODE, w = dec ? 3 : 4;
    int64_t n = l->a[8], stride = l->a[10], bt_tok = l->a[5];
    size_t re = 0, rb = 0, rs = 0;
    const int32_t *ent = (const int32_t *)denorm(l->a[7], &re);
    const int32_t *bt = (const int32_t *)denorm(l->a[9], &rb);
    const int32_t *slots = g.slots ? (const int32_t *)denorm(g.slots, &rs) : NULL;
    if (!ent || !bt || !slots || re < (size_t)(n * w) * 4 || rs < (size_t)g.n_slots * 4 ||
        bt_tok < 1)
        return;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *x = ent + w * i;
        /* decode {row, sequence, length}: one token at length - 1; tile {sequence, first row,
         * tokens, first position} */
        int32_t s = dec ? x[1] : x[0], row0 = dec ? x[0] : x[1], cnt = dec ? 1 : x[2];
        int64_t pos0 = dec ? (int64_t)x[2] - 1 : x[3];
        for (int32_t j = 0; j < cnt; j++) {
            int64_t row = row0 + j, pos = pos0 + j, k = pos / bt_tok;
            if (s >= 0 && pos >= 0 && k >= stride) {
                violation("%s (step %ld): position %lld of sequence %d needs block %lld of a "
                          "block-table row of %lld",
                          fake_cuda_fn_name(l->fn), g.steps, (long long)pos, s, (long long)k,
                          (long long)stride);
                continue;
            }
            if (row < 0 || row >= g.n_slots || s < 0 || pos < 0 ||
                ((size_t)s * stride + k + 1) * 4 > rb)
                continue; /* execute() reports what is outside its buffers */
            if (slots[row] == -1)
                continue; /* a padding row: attends to whatever its entry names, read by no one */
            int32_t id = bt[s * stride + k];
            if ((int64_t)id * bt_tok + pos % bt_tok != slots[row])
                violation("%s (step %ld): sequence %d's block table (stride %lld) names block %d "
                          "for position %lld, whose K/V went to slot %d",
                          fake_cuda_fn_name(l->fn), g.steps, s, (long long)stride, id,
                          (long long)pos, slots[row]);
        }
    }
}

/* What the kernel does when it runs: the checks on indices it reads from device memory, and
 * cuda_argmax's output. */
static void execute(fake_launch *l) {
    size_t room = 0;
    l->reads = metadata_read(l);
    switch (l->fn) {
    case F_KV_WRITE:
    case F_ROPE_KV: {
        /* argument positions of the caches, dtype, kv_dim (or its factors), slots, tokens */
        int kw = l->fn == F_KV_WRITE;
        size_t rk = 0, rv = 0, rs = 0;
        char *kc = denorm(l->a[kw ? 0 : 3], &rk), *vc = denorm(l->a[kw ? 1 : 4], &rv);
        int32_t *slots = (int32_t *)denorm(l->a[kw ? 6 : 7], &rs);
        int64_t kv_dim = kw ? l->a[3] : l->a[10] * l->a[11];
        size_t row = (size_t)kv_dim * dtype_bytes((int)l->a[kw ? 2 : 5]);
        int64_t n = l->a[kw ? 7 : 8];
        if (!kc || !vc || !slots || rs < (size_t)n * 4)
            break;
        for (int64_t t = 0; t < n; t++) /* -1: a padding row, stored nowhere */
            if (slots[t] < -1 ||
                (slots[t] >= 0 && ((size_t)slots[t] + 1) * row > (rk < rv ? rk : rv)))
                violation("%s (step %ld): token %lld goes to slot %d outside the cache",
                          fake_cuda_fn_name(l->fn), g.steps, (long long)t, slots[t]);
        g.slots = l->a[kw ? 6 : 7];
        g.n_slots = n;
        break;
    }
    case F_ATTN_PREFILL: block_table_names_slots(l); break;
    case F_ATTN_DECODE: {
        block_table_names_slots(l);
        size_t rk = 0, rq = 0, rd = 0, rb = 0;
        char *kc = denorm(l->a[0], &rk), *q = denorm(l->a[6], &rq);
        int32_t *dec = (int32_t *)denorm(l->a[7], &rd), *bt = (int32_t *)denorm(l->a[9], &rb);
        int64_t n = l->a[8], max_blocks = l->a[10], bt_tok = l->a[5];
        size_t slot = (size_t)l->a[3] * l->a[4] * dtype_bytes((int)l->a[2]);
        size_t qrow = (size_t)l->a[11] * l->a[4] * 4;
        if (!kc || !q || !dec || !bt || rd < (size_t)n * 12 || bt_tok < 1)
            break;
        for (int64_t i = 0; i < n; i++) {
            int32_t row = dec[3 * i], s = dec[3 * i + 1], len = dec[3 * i + 2];
            int64_t nb = (len + bt_tok - 1) / bt_tok;
            if (row < 0 || ((size_t)row + 1) * qrow > rq || s < 0 || len < 1 || nb > max_blocks ||
                ((size_t)s + 1) * max_blocks * 4 > rb) {
                violation("cuda_attn_decode (step %ld): entry %lld {row %d, sequence %d, "
                          "length %d} outside its buffers",
                          g.steps, (long long)i, row, s, len);
                continue;
            }
            for (int64_t k = 0; k < nb; k++) {
                int32_t id = bt[s * max_blocks + k];
                if (id < 0 || ((size_t)id + 1) * bt_tok * slot > rk)
                    violation("cuda_attn_decode (step %ld): entry %lld reads block %d outside "
                              "the cache",
                              g.steps, (long long)i, id);
            }
        }
        break;
    }
    case F_GATHER: {
        size_t rx = 0, rr = 0;
        char *x = denorm(l->a[0], &rx);
        int32_t *rows = (int32_t *)denorm(l->a[1], &rr);
        int64_t n = l->a[2], cols = l->a[3];
        if (!x || !rows || rr < (size_t)n * 4)
            break;
        for (int64_t r = 0; r < n; r++)
            if (rows[r] < 0 || ((size_t)rows[r] + 1) * cols * 4 > rx)
                violation("cuda_gather_rows (step %ld): row %d outside x", g.steps, rows[r]);
        break;
    }
    case F_ARGMAX:
    case F_SAMPLE: {
        if (l->fn == F_SAMPLE) { /* every row's entries inside pen, and as many raw slots */
            size_t rp = 0, rpe = 0, rraw = 0;
            const cuda_sample_params *prm = (const cuda_sample_params *)denorm(l->a[3], &rp);
            const char *pen = denorm(l->a[4], &rpe), *raw = denorm(l->a[5], &rraw);
            for (int64_t r = 0; prm && r < l->a[1] && (size_t)(r + 1) * sizeof *prm <= rp; r++) {
                int64_t end = (int64_t)prm[r].pen_off + prm[r].pen_n;
                if (prm[r].pen_n > 0 &&
                    (prm[r].pen_off < 0 || !pen || !raw ||
                     (size_t)end * sizeof(cuda_sample_pen) > rpe || (size_t)end * 4 > rraw))
                    violation("cuda_sample (step %ld): row %lld names penalty entries %d..%lld "
                              "outside pen or pen_raw",
                              g.steps, (long long)r, prm[r].pen_off, (long long)end);
            }
        }
        int32_t *out = (int32_t *)denorm(l->a[l->fn == F_ARGMAX ? 3 : 6], &room);
        int64_t rows = l->a[1], vocab = l->a[2];
        if (!out || room < (size_t)rows * 4 || vocab < 1)
            break;
        for (int64_t r = 0; r < rows; r++) {
            uint64_t h = ((uint64_t)g.steps * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)r << 17);
            h ^= h >> 31;
            h *= 0xBF58476D1CE4E5B9ull;
            h ^= h >> 29;
            out[r] = (int32_t)(h % (uint64_t)vocab);
        }
        size_t rt = 0; /* top tokens: the row's own pick, then none */
        int32_t *tt = l->fn == F_SAMPLE ? (int32_t *)denorm(l->a[8], &rt) : NULL;
        for (int64_t r = 0; tt && (size_t)(r + 1) * CUDA_SAMPLE_TOP * 4 <= rt && r < rows; r++)
            for (int j = 0; j < CUDA_SAMPLE_TOP; j++)
                tt[r * CUDA_SAMPLE_TOP + j] = j == 0 ? out[r] : -1;
        break;
    }
    default: break;
    }
}

/* The launch runs now: append it to the stream. */
static void stream_push(const fake_launch *l, int from_graph) {
    const char *s = strchr(fn_spec[l->fn], ' ');
    for (int i = 0; s && i < l->n_args; i++, s = strchr(s + 1, ' ')) {
        const char *colon = strchr(s, ':');
        size_t room;
        if (colon && colon[1] == 'p' && l->a[i] != 0 && !denorm(l->a[i], &room))
            violation("%s (step %ld%s): argument %.*s points into a freed allocation #%lld",
                      fake_cuda_fn_name(l->fn), g.steps, from_graph ? ", from a graph" : "",
                      (int)(colon - s - 1), s + 1, (long long)(l->a[i] >> PTR_SHIFT));
    }
    if (g.n == g.cap) {
        size_t cap = g.cap ? 2 * g.cap : 4096;
        fake_launch *ns = realloc(g.stream, cap * sizeof *ns);
        if (!ns) {
            violation("out of host memory for the launch stream");
            return;
        }
        g.stream = ns;
        g.cap = cap;
    }
    fake_launch *d = &g.stream[g.n++];
    *d = *l;
    d->from_graph = from_graph;
    d->step = g.steps;
    execute(d);
}

static int graph_push(cuda_graph *gr, const fake_launch *l) {
    if (gr->n == gr->cap) {
        size_t cap = gr->cap ? 2 * gr->cap : 256;
        fake_launch *nl = realloc(gr->l, cap * sizeof *nl);
        if (!nl)
            return -1;
        gr->l = nl;
        gr->cap = cap;
    }
    gr->l[gr->n++] = *l;
    return 0;
}

/* A launch enqueued on the ctx stream: runs now, or joins the graph being captured. */
static int enqueue(cuda_ctx *c, fake_launch *r, md_err *e) {
    if (c->capturing) {
        if (graph_push(c->cap, r))
            return md_errf(e, MD_ENOMEM, "fake CUDA: out of host memory for a graph");
        return 0;
    }
    stream_push(r, 0);
    return 0;
}

#define GUARD(c, e)                                                                                \
    do {                                                                                           \
        if ((c)->failed.code)                                                                      \
            return cuda_ctx_failed((c), (e));                                                      \
    } while (0)

/* As ctx.cu's capture_fail: an operation a capture does not allow fails the capture only. */
static int capture_fail(cuda_ctx *c, const char *what, md_err *e) {
    if (!c->capture_failed.code)
        md_errf(&c->capture_failed, MD_EDEVICE,
                "CUDA device %d: %s failed while recording a graph: operation not permitted "
                "when stream is capturing",
                c->ordinal, what);
    if (e)
        *e = c->capture_failed;
    return MD_EDEVICE;
}

/* ---- pinned host memory and copies ---------------------------------------------- */

static int is_pinned(const void *p, size_t n) {
    for (size_t i = 0; i < sizeof g.pinned / sizeof g.pinned[0]; i++)
        if (g.pinned[i].p && (const char *)p >= (const char *)g.pinned[i].p &&
            (const char *)p + n <= (const char *)g.pinned[i].p + g.pinned[i].n)
            return 1;
    return 0;
}

/* Copies from pinned memory queued at stream positions <= pos are done: their source must
 * not have changed since they were queued (the host may rewrite it only after that). */
static void copies_done(size_t pos) {
    int k = 0;
    for (int i = 0; i < g.n_pending; i++) {
        pending_copy *p = &g.pending[i];
        if (p->pos > pos) {
            g.pending[k++] = *p;
            continue;
        }
        if (hash_bytes(p->src, p->bytes) != p->hash)
            violation("pinned host memory %p (%zu bytes) was rewritten before its upload "
                      "(stream position %zu) was known complete",
                      p->src, p->bytes, p->pos);
    }
    g.n_pending = k;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    for (size_t i = 0; i < sizeof g.pinned / sizeof g.pinned[0]; i++)
        if (!g.pinned[i].p) {
            if (!(*ptr = calloc(1, size ? size : 1)))
                return cudaErrorMemoryAllocation;
            g.pinned[i].p = *ptr;
            g.pinned[i].n = size;
            return cudaSuccess;
        }
    return cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *ptr) {
    for (size_t i = 0; i < sizeof g.pinned / sizeof g.pinned[0]; i++)
        if (ptr && g.pinned[i].p == ptr) {
            for (int k = 0; k < g.n_pending; k++)
                if ((const char *)g.pending[k].src >= (char *)ptr &&
                    (const char *)g.pending[k].src < (char *)ptr + g.pinned[i].n)
                    violation("cudaFreeHost of pinned memory an unfinished upload reads");
            g.pinned[i].p = NULL;
            free(ptr);
            return cudaSuccess;
        }
    return ptr ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    *event = calloc(1, sizeof **event);
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    (void)stream;
    event->pos = g.n;
    g.steps++;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    copies_done(event->pos);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    free(event);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error) {
    return error == cudaSuccess ? "no error" : "fake CUDA error";
}

/* ---- cuda_ops.h: device, context, pool ------------------------------------------- */

int cuda_device_count(char *why, size_t whysz) {
    if (why && whysz)
        why[0] = 0;
    return 1;
}

int cuda_device_query(int ordinal, cuda_device_info *info, md_err *e) {
    if (ordinal != 0)
        return md_errf(e, MD_EDEVICE, "fake CUDA: no device %d (1 device)", ordinal);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "fake CUDA device");
    info->cc_major = 9;
    info->n_sm = FAKE_SMS;
    info->total_bytes = dev_total();
    info->free_bytes = dev_free();
    return 0;
}

int cuda_ctx_open(int ordinal, cuda_ctx **out, md_err *e) {
    cuda_device_info in;
    int rc = cuda_device_query(ordinal, &in, e);
    if (rc)
        return rc;
    if (!(*out = calloc(1, sizeof **out)))
        return md_errf(e, MD_ENOMEM, "fake CUDA: out of host memory");
    (*out)->ordinal = ordinal;
    return 0;
}

static void graph_free(cuda_graph *gr) {
    if (gr) {
        free(gr->l);
        free(gr);
    }
}

void cuda_ctx_close(cuda_ctx *c) {
    if (!c)
        return;
    copies_done((size_t)-1);
    graph_free(c->cap);
    g.st.live_at_close = (long)g.n_allocs;
    g.st.live_bytes_at_close = g.used;
    for (size_t i = 0; i < g.n_allocs && i < 32; i++)
        g.st.live_ids_at_close[i] = g.allocs[i].id;
    while (g.n_allocs) /* the pool goes with the ctx */
        fake_free(g.allocs[g.n_allocs - 1].base);
    free(c);
}

cudaStream_t cuda_ctx_stream(cuda_ctx *c) {
    return (cudaStream_t)c;
}

int cuda_ctx_ordinal(const cuda_ctx *c) {
    return c->ordinal;
}

int cuda_ctx_failed(const cuda_ctx *c, md_err *e) {
    if (!c->failed.code)
        return 0;
    if (e)
        *e = c->failed;
    return c->failed.code;
}

int cuda_sync(cuda_ctx *c, md_err *e) {
    GUARD(c, e);
    if (c->capturing)
        return capture_fail(c, "stream synchronize", e);
    copies_done((size_t)-1);
    return 0;
}

int cuda_check(cuda_ctx *c, const char *what, md_err *e) {
    GUARD(c, e);
    return 0;
}

int cuda_pool_alloc(cuda_ctx *c, size_t bytes, void **out, md_err *e) {
    GUARD(c, e);
    if (c->capturing) {
        g.st.allocs_refused++;
        return md_errf(e, MD_EINVAL, "cuda:%d: allocation while capturing a CUDA graph",
                       c->ordinal);
    }
    if (bytes > dev_free())
        return md_errf(e, MD_ENOMEM, "fake CUDA: cannot allocate %zu bytes (%zu free of %zu)",
                       bytes, dev_free(), dev_total());
    if (!(*out = fake_alloc(bytes)))
        return md_errf(e, MD_ENOMEM, "fake CUDA: out of host memory for %zu bytes", bytes);
    return 0;
}

void cuda_pool_free(cuda_ctx *c, void *p) {
    if (p)
        fake_free(p);
}

size_t cuda_pool_used(const cuda_ctx *c) {
    return g.used;
}

size_t cuda_pool_reserved(const cuda_ctx *c) {
    return g.used;
}

int cuda_check_fits(cuda_ctx *c, size_t need, const char *what, md_err *e) {
    GUARD(c, e);
    if (need > dev_free())
        return md_errf(e, MD_ENOMEM, "%s does not fit on the fake CUDA device", what);
    return 0;
}

int cuda_mem_info(cuda_ctx *c, size_t *avail, size_t *total, md_err *e) {
    GUARD(c, e);
    *avail = dev_free();
    *total = dev_total();
    return 0;
}

int cuda_upload(cuda_ctx *c, void *dst, const void *src, size_t bytes, md_err *e) {
    GUARD(c, e);
    if (c->capturing)
        return capture_fail(c, "host-to-device copy", e);
    fake_launch r;
    rec_init(&r, F_UPLOAD);
    arg_p(&r, dst, bytes, "dst");
    arg_i(&r, (int64_t)bytes);
    uint64_t h = hash_bytes(src, bytes);
    int pinned = is_pinned(src, bytes);
    arg_i(&r, pinned ? 0 : (int64_t)h); /* staging: the kernels' reads are compared instead */
    if (r.a[0] > 0 && bytes)
        memcpy(dst, src, bytes);
    if (pinned) {
        if (g.n_pending == (int)(sizeof g.pending / sizeof g.pending[0]))
            copies_done((size_t)-1);
        g.pending[g.n_pending++] = (pending_copy){src, bytes, h, g.n + 1};
    }
    stream_push(&r, 0);
    return 0;
}

int cuda_download(cuda_ctx *c, void *host_dst, const void *src, size_t bytes, md_err *e) {
    GUARD(c, e);
    if (c->capturing)
        return capture_fail(c, "device-to-host copy", e);
    /* the real one synchronizes the stream; the copy is not a launch worth comparing */
    if (norm_ptr(src, bytes, "cuda_download", "src") > 0 && bytes)
        memcpy(host_dst, src, bytes);
    copies_done((size_t)-1);
    return 0;
}

int cuda_memset0(cuda_ctx *c, void *dst, size_t bytes, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_MEMSET0);
    arg_p(&r, dst, bytes, "dst");
    arg_i(&r, (int64_t)bytes);
    if (!c->capturing && r.a[0] > 0 && bytes)
        memset(dst, 0, bytes);
    return enqueue(c, &r, e);
}

int cuda_fill_random(cuda_ctx *c, void *dst, cuda_dtype dtype, int64_t n, float scale,
                     uint64_t seed, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_FILL_RANDOM);
    arg_p(&r, dst, (size_t)n * dtype_bytes(dtype), "dst");
    arg_i(&r, dtype);
    arg_i(&r, n);
    arg_f(&r, scale);
    arg_i(&r, (int64_t)seed);
    return enqueue(c, &r, e);
}

unsigned cuda_ctx_scratch_gen(const cuda_ctx *c) {
    return c->scratch_gen;
}

void cuda_ctx_scratch_moved(cuda_ctx *c) {
    c->scratch_gen++;
    g.st.scratch_moves++;
}

/* ctx.cu's cuda_scratch: grow slot `which` (never while capturing: the pool refuses). */
static int scratch(cuda_ctx *c, int which, size_t bytes, void **out, md_err *e) {
    if (c->scratch_bytes[which] < bytes) {
        void *p = NULL;
        int rc = cuda_pool_alloc(c, bytes, &p, e);
        if (rc)
            return rc;
        cuda_pool_free(c, c->scratch[which]);
        c->scratch[which] = p;
        c->scratch_bytes[which] = bytes;
        cuda_ctx_scratch_moved(c);
    }
    *out = c->scratch[which];
    return 0;
}

/* ---- compute launchers ------------------------------------------------------------- */

/* The real kernels' types only (md_type_supported): 0 for any other, as they answer. */
static size_t kernel_row_bytes(int gtype, int64_t n) {
    return md_type_supported(gtype) ? md_type_row_bytes(gtype, n) : 0;
}
static int kernel_block(int gtype) {
    return md_type_supported(gtype) ? md_type_block(gtype) : 0;
}

int cuda_dequantize(cuda_ctx *c, int gtype, const void *src, void *dst, cuda_dtype out, int64_t n,
                    md_err *e) {
    GUARD(c, e);
    size_t in = kernel_row_bytes(gtype, n);
    if (in == 0)
        return md_errf(e, MD_EINVAL, "fake CUDA: dequantize %lld elements of type %d", (long long)n,
                       gtype);
    fake_launch r;
    rec_init(&r, F_DEQUANT);
    arg_i(&r, gtype);
    arg_p(&r, src, in, "src");
    arg_p(&r, dst, (size_t)n * dtype_bytes(out), "dst");
    arg_i(&r, out);
    arg_i(&r, n);
    return enqueue(c, &r, e);
}

size_t cuda_ggml_bytes(int gtype, int64_t n) {
    return kernel_row_bytes(gtype, n);
}

int cuda_rmsnorm(cuda_ctx *c, const float *x, const float *w, float eps, int rows, int dim,
                 void *out, cuda_dtype out_type, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_RMSNORM);
    arg_p(&r, x, (size_t)rows * dim * 4, "x");
    arg_p(&r, w, (size_t)dim * 4, "w");
    arg_f(&r, eps);
    arg_i(&r, rows);
    arg_i(&r, dim);
    arg_p(&r, out, (size_t)rows * dim * dtype_bytes(out_type), "out");
    arg_i(&r, out_type);
    return enqueue(c, &r, e);
}

int cuda_rope(cuda_ctx *c, float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
              int rot_dim, const float *inv_freq, int neox, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_ROPE);
    arg_p(&r, x, (size_t)n_tokens * n_heads * head_dim * 4, "x");
    arg_p(&r, pos, (size_t)n_tokens * 4, "pos");
    arg_i(&r, n_tokens);
    arg_i(&r, n_heads);
    arg_i(&r, head_dim);
    arg_i(&r, rot_dim);
    arg_p(&r, inv_freq, (size_t)rot_dim / 2 * 4, "inv_freq");
    arg_i(&r, neox);
    return enqueue(c, &r, e);
}

int cuda_swiglu(cuda_ctx *c, const float *gate, const float *up, void *out, cuda_dtype out_type,
                int64_t n, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_SWIGLU);
    arg_p(&r, gate, (size_t)n * 4, "gate");
    arg_p(&r, up, (size_t)n * 4, "up");
    arg_p(&r, out, (size_t)n * dtype_bytes(out_type), "out");
    arg_i(&r, out_type);
    arg_i(&r, n);
    return enqueue(c, &r, e);
}

int cuda_add(cuda_ctx *c, float *y, const float *x, int64_t n, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_ADD);
    arg_p(&r, y, (size_t)n * 4, "y");
    arg_p(&r, x, (size_t)n * 4, "x");
    arg_i(&r, n);
    return enqueue(c, &r, e);
}

int cuda_add_bias(cuda_ctx *c, float *y, const float *bias, int rows, int cols, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_ADD_BIAS);
    arg_p(&r, y, (size_t)rows * cols * 4, "y");
    arg_p(&r, bias, (size_t)cols * 4, "bias");
    arg_i(&r, rows);
    arg_i(&r, cols);
    return enqueue(c, &r, e);
}

int cuda_convert(cuda_ctx *c, const float *x, void *dst, cuda_dtype out_type, int64_t n,
                 md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_CONVERT);
    arg_p(&r, x, (size_t)n * 4, "x");
    arg_p(&r, dst, (size_t)n * dtype_bytes(out_type), "dst");
    arg_i(&r, out_type);
    arg_i(&r, n);
    return enqueue(c, &r, e);
}

int cuda_get_rows(cuda_ctx *c, const void *table, int gtype, int64_t n_rows, int dim,
                  const int32_t *ids, int n, float *out, int *bad_id, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_GET_ROWS);
    arg_p(&r, table, (size_t)n_rows * kernel_row_bytes(gtype, dim), "table");
    arg_i(&r, gtype);
    arg_i(&r, n_rows);
    arg_i(&r, dim);
    arg_p(&r, ids, (size_t)n * 4, "ids");
    arg_i(&r, n);
    arg_p(&r, out, (size_t)n * dim * 4, "out");
    arg_p(&r, bad_id, bad_id ? sizeof *bad_id : 0, "bad_id");
    return enqueue(c, &r, e);
}

int cuda_gather_rows(cuda_ctx *c, const float *x, const int32_t *rows, int n_rows, int cols,
                     float *out, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_GATHER);
    arg_p(&r, x, (size_t)cols * 4, "x");
    arg_p(&r, rows, (size_t)n_rows * 4, "rows");
    arg_i(&r, n_rows);
    arg_i(&r, cols);
    arg_p(&r, out, (size_t)n_rows * cols * 4, "out");
    return enqueue(c, &r, e);
}

int cuda_matmul(cuda_ctx *c, const void *w, int wtype, size_t row_bytes, const float *x, float *y,
                int m, int n, int k, float beta, int force_cublas, md_err *e) {
    GUARD(c, e);
    int blk = kernel_block(wtype);
    if (blk == 0)
        return md_errf(e, MD_EUNSUPP, "CUDA matmul: weight type %d is not supported", wtype);
    if (m < 0 || n <= 0 || k <= 0 || k % blk)
        return md_errf(e, MD_EINVAL, "CUDA matmul: bad shape m %d, n %d, k %d", m, n, k);
    if (row_bytes != kernel_row_bytes(wtype, k))
        return md_errf(e, MD_EINVAL, "CUDA matmul: rows of %zu bytes for %d elements of type %d",
                       row_bytes, k, wtype);
    if (m == 0)
        return 0;
    fake_launch r;
    if (m <= CUDA_GEMV_MAX_M && !force_cublas) {
        rec_init(&r, F_GEMV);
        arg_p(&r, w, (size_t)n * row_bytes, "w");
        arg_i(&r, wtype);
        arg_i(&r, (int64_t)row_bytes);
        arg_p(&r, x, (size_t)m * k * 4, "x");
        arg_p(&r, y, (size_t)m * n * 4, "y");
        arg_i(&r, m);
        arg_i(&r, n);
        arg_i(&r, k);
        arg_f(&r, beta);
        return enqueue(c, &r, e);
    }
    if (wtype == MD_TYPE_F32) {
        rec_init(&r, F_SGEMM);
        arg_p(&r, w, (size_t)n * row_bytes, "w");
        arg_p(&r, x, (size_t)m * k * 4, "x");
        arg_p(&r, y, (size_t)m * n * 4, "y");
        arg_i(&r, m);
        arg_i(&r, n);
        arg_i(&r, k);
        arg_f(&r, beta);
        return enqueue(c, &r, e);
    }
    cuda_dtype xt = wtype == MD_TYPE_F16 ? CUDA_F16 : CUDA_BF16;
    void *xs = NULL;
    int rc = scratch(c, 0, (size_t)m * k * 2, &xs, e);
    if (rc || (rc = cuda_convert(c, x, xs, xt, (int64_t)m * k, e)))
        return rc;
    const void *wm = w;
    if (wtype != MD_TYPE_F16 && wtype != MD_TYPE_BF16) {
        void *ws = NULL;
        if ((rc = scratch(c, 1, (size_t)n * k * 2, &ws, e)) ||
            (rc = cuda_dequantize(c, wtype, w, ws, CUDA_BF16, (int64_t)n * k, e)))
            return rc;
        wm = ws;
    }
    rec_init(&r, F_GEMM);
    arg_p(&r, wm, (size_t)n * k * 2, "w");
    arg_p(&r, xs, (size_t)m * k * 2, "x");
    arg_i(&r, xt);
    arg_p(&r, y, (size_t)m * n * 4, "y");
    arg_i(&r, m);
    arg_i(&r, n);
    arg_i(&r, k);
    arg_f(&r, beta);
    return enqueue(c, &r, e);
}

/* gemm.cu's cuda_matmul_n: on the GEMV path one launch per weight type (a record per weight
 * in it) or one gate/up launch; on the cuBLAS path x converted once per 16-bit type. */
int cuda_matmul_n(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  int force_cublas, md_err *e) {
    GUARD(c, e);
    if (n_w < 1 || n_w > CUDA_MM_MAX ||
        (mode != CUDA_MM_SET && mode != CUDA_MM_ACC && mode != CUDA_MM_SWIGLU) ||
        (mode == CUDA_MM_SWIGLU && (n_w != 2 || w[0].n != w[1].n)))
        return md_errf(e, MD_EINVAL, "CUDA matmul: %d weights, mode %d", n_w, mode);
    for (int i = 0; i < n_w; i++) {
        int blk = kernel_block(w[i].wtype);
        if (blk == 0)
            return md_errf(e, MD_EUNSUPP, "CUDA matmul: weight type %d is not supported",
                           w[i].wtype);
        if (m < 0 || w[i].n <= 0 || k <= 0 || k % blk ||
            w[i].row_bytes != kernel_row_bytes(w[i].wtype, k))
            return md_errf(e, MD_EINVAL, "CUDA matmul: bad shape m %d, n %d, k %d", m, w[i].n, k);
    }
    if (m == 0)
        return 0;
    int swiglu = mode == CUDA_MM_SWIGLU;
    float beta = mode == CUDA_MM_ACC ? 1.0f : 0.0f;
    fake_launch r;
    int rc;
    if (m <= CUDA_GEMV_MAX_M && !force_cublas) {
        if (swiglu && w[0].wtype == w[1].wtype) {
            rec_init(&r, F_GEMV_SWIGLU);
            arg_p(&r, w[0].w, (size_t)w[0].n * w[0].row_bytes, "w_gate");
            arg_p(&r, w[1].w, (size_t)w[1].n * w[1].row_bytes, "w_up");
            arg_i(&r, w[0].wtype);
            arg_i(&r, (int64_t)w[0].row_bytes);
            arg_p(&r, x, (size_t)m * k * 4, "x");
            arg_p(&r, w[0].y, (size_t)m * w[0].n * 4, "y");
            arg_i(&r, m);
            arg_i(&r, w[0].n);
            arg_i(&r, k);
            return enqueue(c, &r, e);
        }
        int taken[CUDA_MM_MAX] = {0};
        for (int i = 0; i < n_w; i++) {
            if (taken[i])
                continue;
            int grp[CUDA_MM_MAX], ng = 0;
            for (int j = i; j < (swiglu ? i + 1 : n_w); j++)
                if (!taken[j] && w[j].wtype == w[i].wtype)
                    taken[j] = 1, grp[ng++] = j;
            for (int s = 0; s < ng; s++) {
                const cuda_mm_w *wj = &w[grp[s]];
                rec_init(&r, F_GEMV_N);
                arg_p(&r, wj->w, (size_t)wj->n * wj->row_bytes, "w");
                arg_i(&r, wj->wtype);
                arg_i(&r, (int64_t)wj->row_bytes);
                arg_p(&r, x, (size_t)m * k * 4, "x");
                arg_p(&r, wj->y, (size_t)m * wj->n * 4, "y");
                arg_i(&r, m);
                arg_i(&r, wj->n);
                arg_i(&r, k);
                arg_f(&r, swiglu ? 0.0f : beta);
                arg_i(&r, s);
                arg_i(&r, ng);
                if ((rc = enqueue(c, &r, e)))
                    return rc;
            }
        }
        return swiglu ? cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e)
                      : 0;
    }
    float b = swiglu ? 0.0f : beta;
    int64_t wrows = 0;
    for (int i = 0; i < n_w; i++)
        if (w[i].wtype != MD_TYPE_F32 && w[i].wtype != MD_TYPE_F16 && w[i].wtype != MD_TYPE_BF16 &&
            !w[i].bf16 && w[i].n > wrows)
            wrows = w[i].n;
    void *ws = NULL;
    if (wrows && (rc = scratch(c, 1, (size_t)wrows * k * 2, &ws, e)))
        return rc;
    for (int i = 0; i < n_w; i++) {
        if (w[i].wtype != MD_TYPE_F32)
            continue;
        rec_init(&r, F_SGEMM);
        arg_p(&r, w[i].w, (size_t)w[i].n * w[i].row_bytes, "w");
        arg_p(&r, x, (size_t)m * k * 4, "x");
        arg_p(&r, w[i].y, (size_t)m * w[i].n * 4, "y");
        arg_i(&r, m);
        arg_i(&r, w[i].n);
        arg_i(&r, k);
        arg_f(&r, b);
        if ((rc = enqueue(c, &r, e)))
            return rc;
    }
    for (int pass = 0; pass < 2; pass++) {
        cuda_dtype xt = pass == 0 ? CUDA_BF16 : CUDA_F16;
        void *xs = NULL;
        for (int i = 0; i < n_w; i++) {
            if (w[i].wtype == MD_TYPE_F32 || (w[i].wtype == MD_TYPE_F16) != (xt == CUDA_F16))
                continue;
            if (!xs && ((rc = scratch(c, 0, (size_t)m * k * 2, &xs, e)) ||
                        (rc = cuda_convert(c, x, xs, xt, (int64_t)m * k, e))))
                return rc;
            const void *wm = w[i].w;
            if (w[i].wtype != MD_TYPE_F16 && w[i].wtype != MD_TYPE_BF16) {
                if (w[i].bf16) /* the caller's BF16 copy */
                    wm = w[i].bf16;
                else if ((rc = cuda_dequantize(c, w[i].wtype, w[i].w, ws, CUDA_BF16,
                                               (int64_t)w[i].n * k, e)))
                    return rc;
                else
                    wm = ws;
            }
            rec_init(&r, F_GEMM);
            arg_p(&r, wm, (size_t)w[i].n * k * 2, "w");
            arg_p(&r, xs, (size_t)m * k * 2, "x");
            arg_i(&r, xt);
            arg_p(&r, w[i].y, (size_t)m * w[i].n * 4, "y");
            arg_i(&r, m);
            arg_i(&r, w[i].n);
            arg_i(&r, k);
            arg_f(&r, b);
            if ((rc = enqueue(c, &r, e)))
                return rc;
        }
    }
    return swiglu ? cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e) : 0;
}

int cuda_kv_write(cuda_ctx *c, void *k_cache, void *v_cache, cuda_dtype dtype, int kv_dim,
                  const float *k, const float *v, const int32_t *slots, int n_tokens, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_KV_WRITE);
    arg_p(&r, k_cache, 0, "k_cache");
    arg_p(&r, v_cache, 0, "v_cache");
    arg_i(&r, dtype);
    arg_i(&r, kv_dim);
    arg_p(&r, k, (size_t)n_tokens * kv_dim * 4, "k");
    arg_p(&r, v, (size_t)n_tokens * kv_dim * 4, "v");
    arg_p(&r, slots, (size_t)n_tokens * 4, "slots");
    arg_i(&r, n_tokens);
    return enqueue(c, &r, e);
}

int cuda_rope_kv(cuda_ctx *c, float *q, const float *k, const float *v, void *k_cache,
                 void *v_cache, cuda_dtype dtype, const int32_t *pos, const int32_t *slots,
                 int n_tokens, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                 const float *inv_freq, int neox, md_err *e) {
    GUARD(c, e);
    if (n_tokens < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
        rot_dim <= 0 || rot_dim % 2 || rot_dim > head_dim)
        return md_errf(e, MD_EINVAL, "CUDA rope_kv: bad shape");
    size_t kv = (size_t)n_tokens * n_kv_heads * head_dim * 4;
    fake_launch r;
    rec_init(&r, F_ROPE_KV);
    arg_p(&r, q, (size_t)n_tokens * n_heads * head_dim * 4, "q");
    arg_p(&r, k, kv, "k");
    arg_p(&r, v, kv, "v");
    arg_p(&r, k_cache, 0, "k_cache");
    arg_p(&r, v_cache, 0, "v_cache");
    arg_i(&r, dtype);
    arg_p(&r, pos, (size_t)n_tokens * 4, "pos");
    arg_p(&r, slots, (size_t)n_tokens * 4, "slots");
    arg_i(&r, n_tokens);
    arg_i(&r, n_heads);
    arg_i(&r, n_kv_heads);
    arg_i(&r, head_dim);
    arg_i(&r, rot_dim);
    arg_p(&r, inv_freq, (size_t)rot_dim / 2 * 4, "inv_freq");
    arg_i(&r, neox);
    return enqueue(c, &r, e);
}

size_t cuda_attn_decode_work_bytes(int n, int n_heads, int head_dim, int n_splits) {
    return (size_t)n * n_heads * n_splits * (2 + head_dim) * sizeof(float); /* as attention.cu */
}

int cuda_attn_shape_ok(int n_heads, int n_kv_heads, int head_dim, cuda_dtype dtype, md_err *e) {
    /* the shapes attention.cu's kernels take */
    if ((head_dim != 64 && head_dim != 128 && head_dim != 256) || n_kv_heads <= 0 || n_heads <= 0 ||
        n_heads % n_kv_heads || n_heads / n_kv_heads > 8 ||
        (dtype != CUDA_F32 && dtype != CUDA_F16 && dtype != CUDA_BF16))
        return md_errf(e, MD_EUNSUPP, "CUDA attention: %d heads over %d of head_dim %d", n_heads,
                       n_kv_heads, head_dim);
    return 0;
}

static void kv_args(fake_launch *r, const cuda_kv_layer *kv) {
    arg_p(r, kv->k, 0, "k_cache");
    arg_p(r, kv->v, 0, "v_cache");
    arg_i(r, kv->dtype);
    arg_i(r, kv->n_kv_heads);
    arg_i(r, kv->head_dim);
    arg_i(r, kv->block_tokens);
}

int cuda_attn_decode(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *dec,
                     int n, const int32_t *block_table, int max_blocks, int n_heads, float scale,
                     int n_splits, void *work, float *out, md_err *e) {
    GUARD(c, e);
    if (n_splits < 1 || n_heads % kv->n_kv_heads)
        return md_errf(e, MD_EINVAL, "CUDA attention: %d splits, %d heads over %d", n_splits,
                       n_heads, kv->n_kv_heads);
    fake_launch r;
    rec_init(&r, F_ATTN_DECODE);
    kv_args(&r, kv);
    arg_p(&r, q, 0, "q");
    arg_p(&r, dec, (size_t)n * 12, "dec");
    arg_i(&r, n);
    arg_p(&r, block_table, (size_t)max_blocks * 4, "block_table");
    arg_i(&r, max_blocks);
    arg_i(&r, n_heads);
    arg_f(&r, scale);
    arg_i(&r, n_splits);
    arg_p(&r, work, cuda_attn_decode_work_bytes(n, n_heads, kv->head_dim, n_splits), "work");
    arg_p(&r, out, 0, "out");
    return enqueue(c, &r, e);
}

int cuda_attn_prefill(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *tiles,
                      int n_tiles, const int32_t *block_table, int max_blocks, int n_heads,
                      float scale, float *out, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_ATTN_PREFILL);
    kv_args(&r, kv);
    arg_p(&r, q, 0, "q");
    arg_p(&r, tiles, (size_t)n_tiles * 16, "tiles");
    arg_i(&r, n_tiles);
    arg_p(&r, block_table, (size_t)max_blocks * 4, "block_table");
    arg_i(&r, max_blocks);
    arg_i(&r, n_heads);
    arg_f(&r, scale);
    arg_p(&r, out, 0, "out");
    return enqueue(c, &r, e);
}

int cuda_argmax(cuda_ctx *c, const float *logits, int rows, int vocab, int32_t *out, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_ARGMAX);
    arg_p(&r, logits, (size_t)rows * vocab * 4, "logits");
    arg_i(&r, rows);
    arg_i(&r, vocab);
    arg_p(&r, out, (size_t)rows * 4, "out");
    return enqueue(c, &r, e);
}

int cuda_sample(cuda_ctx *c, float *logits, int rows, int vocab, const cuda_sample_params *params,
                const cuda_sample_pen *pen, float *pen_raw, int32_t *out, float *logprob,
                int32_t *top_tok, float *top_lp, md_err *e) {
    GUARD(c, e);
    fake_launch r;
    rec_init(&r, F_SAMPLE);
    arg_p(&r, logits, (size_t)rows * vocab * 4, "logits");
    arg_i(&r, rows);
    arg_i(&r, vocab);
    arg_p(&r, params, (size_t)rows * sizeof *params, "params");
    /* the entries the rows name are checked when the launch runs (they are uploaded first) */
    arg_p(&r, pen, 0, "pen");
    arg_p(&r, pen_raw, 0, "pen_raw");
    arg_p(&r, out, (size_t)rows * 4, "out");
    arg_p(&r, logprob, logprob ? (size_t)rows * 4 : 0, "logprob");
    arg_p(&r, top_tok, top_tok ? (size_t)rows * CUDA_SAMPLE_TOP * 4 : 0, "top_tok");
    arg_p(&r, top_lp, top_lp ? (size_t)rows * CUDA_SAMPLE_TOP * 4 : 0, "top_lp");
    return enqueue(c, &r, e);
}

/* ---- graphs ------------------------------------------------------------------------ */

int cuda_graph_begin(cuda_ctx *c, md_err *e) {
    GUARD(c, e);
    if (c->capturing)
        return md_errf(e, MD_EINVAL, "fake CUDA: capture inside a capture");
    if (!(c->cap = calloc(1, sizeof *c->cap)))
        return md_errf(e, MD_ENOMEM, "fake CUDA: out of host memory for a graph");
    c->capturing = 1;
    memset(&c->capture_failed, 0, sizeof c->capture_failed);
    g.st.captures++;
    if (g.st.graphs_freed_running > 0 || g.frees_unlaunched > 0)
        g.st.captures_after_drop++;
    return 0;
}

void cuda_graph_abort(cuda_ctx *c) {
    if (!c->capturing)
        return;
    c->capturing = 0;
    graph_free(c->cap);
    c->cap = NULL;
    g.st.captures_aborted++;
}

int cuda_graph_end(cuda_ctx *c, cuda_graph **out, md_err *e) {
    *out = NULL;
    if (!c->capturing)
        return md_errf(e, MD_EINVAL, "cuda:%d: no graph capture to end", c->ordinal);
    c->capturing = 0;
    cuda_graph *gr = c->cap;
    c->cap = NULL;
    g.ends++;
    if (c->failed.code) {
        graph_free(gr);
        return cuda_ctx_failed(c, e);
    }
    if (c->capture_failed.code) {
        graph_free(gr);
        if (e)
            *e = c->capture_failed;
        g.st.captures_failed++;
        return CUDA_ECAPTURE;
    }
    if (g.fail_every > 0 && g.ends % g.fail_every == 0) {
        graph_free(gr);
        md_errf(e, MD_EDEVICE, "CUDA device %d: graph capture failed (injected by fake_cuda)",
                c->ordinal);
        g.st.captures_failed++;
        g.st.captures_injected++;
        return CUDA_ECAPTURE;
    }
    *out = gr;
    return 0;
}

int cuda_graph_launch(cuda_ctx *c, cuda_graph *gr, md_err *e) {
    GUARD(c, e);
    if (c->capturing)
        return capture_fail(c, "graph launch", e);
    g.st.graphs_freed_running += g.frees_unlaunched;
    g.frees_unlaunched = 0;
    g.st.graph_launches++;
    for (size_t i = 0; i < gr->n; i++)
        stream_push(&gr->l[i], 1);
    return 0;
}

void cuda_graph_free(cuda_graph *gr) {
    if (!gr)
        return;
    g.st.graphs_freed++;
    g.frees_unlaunched++;
    graph_free(gr);
}

/* ---- fake_cuda.h ------------------------------------------------------------------ */

void fake_cuda_reset(void) {
    free(g.stream);
    g.stream = NULL;
    g.n = g.cap = 0;
    g.next_id = 1;
    g.steps = g.ends = 0;
    g.slots = g.n_slots = 0;
    g.fail_every = 0;
    g.total = 0;
    g.frees_unlaunched = 0;
    g.n_pending = 0;
    memset(&g.st, 0, sizeof g.st);
}

void fake_cuda_fail_capture_end(int every) {
    g.fail_every = every;
}

void fake_cuda_set_total(size_t bytes) {
    g.total = bytes;
}

long fake_cuda_live(size_t *bytes) {
    if (bytes)
        *bytes = g.used;
    return (long)g.n_allocs;
}

const fake_launch *fake_cuda_stream(size_t *n) {
    *n = g.n;
    return g.stream;
}

void fake_cuda_get_stats(fake_cuda_stats *out) {
    *out = g.st;
}

int fake_cuda_launch_eq(const fake_launch *a, const fake_launch *b) {
    return a->fn == b->fn && a->n_args == b->n_args && a->reads == b->reads &&
           !memcmp(a->a, b->a, (size_t)a->n_args * sizeof a->a[0]);
}

const char *fake_cuda_fn_name(int fn) {
    static char names[F_N][32];
    if (fn < 0 || fn >= F_N)
        return "?";
    if (!names[fn][0])
        snprintf(names[fn], sizeof names[fn], "%.*s", (int)strcspn(fn_spec[fn], " "), fn_spec[fn]);
    return names[fn];
}

void fake_cuda_format(const fake_launch *l, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "%s(", fake_cuda_fn_name(l->fn));
    const char *s = strchr(fn_spec[l->fn], ' ');
    for (int i = 0; s && i < l->n_args && o < n; i++, s = strchr(s + 1, ' ')) {
        const char *colon = strchr(s, ':');
        int len = (int)(colon - s - 1);
        int64_t v = l->a[i];
        const char *sep = i ? ", " : "";
        if (colon[1] == 'p')
            o += (size_t)(v <= 0 ? snprintf(buf + o, n - o, "%s%.*s=%s", sep, len, s + 1,
                                            v ? "?" : "NULL")
                                 : snprintf(buf + o, n - o, "%s%.*s=#%lld+%lld", sep, len, s + 1,
                                            (long long)(v >> PTR_SHIFT),
                                            (long long)(v & (((int64_t)1 << PTR_SHIFT) - 1))));
        else if (colon[1] == 'f') {
            uint32_t u = (uint32_t)v;
            float f;
            memcpy(&f, &u, sizeof f);
            o += (size_t)snprintf(buf + o, n - o, "%s%.*s=%g", sep, len, s + 1, f);
        } else if (colon[1] == 'h')
            o += (size_t)snprintf(buf + o, n - o, "%s%.*s=%016llx", sep, len, s + 1,
                                  (unsigned long long)v);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%.*s=%lld", sep, len, s + 1, (long long)v);
    }
    if (o < n)
        snprintf(buf + o, n - o, ")%s%.0llx [step %ld%s]", l->reads ? " reads " : "",
                 (unsigned long long)l->reads, l->step, l->from_graph ? ", from a graph" : "");
}

int64_t fake_cuda_arg(const fake_launch *l, const char *name) {
    size_t nl = strlen(name);
    const char *s = strchr(fn_spec[l->fn], ' ');
    for (int i = 0; s && i < l->n_args; i++, s = strchr(s + 1, ' '))
        if (!strncmp(s + 1, name, nl) && s[1 + nl] == ':')
            return l->a[i];
    return 0;
}
