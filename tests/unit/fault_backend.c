/* fault_backend.c — the CPU backend behind a table that counts op calls and injects one
 * device failure (an error like kernels/cuda's, sticky or transient, or NaN output) where the
 * device name says. See fault_backend.h for the spec. */
#include "unit/fault_backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    OP_NONE = -1,
    OP_BUF_ALLOC,
    OP_BUF_WRAP,
    OP_BUF_UPLOAD,
    OP_BUF_DOWNLOAD,
    OP_BUF_ZERO,
    OP_RESERVE,
    OP_BATCH_PREPARE,
    OP_EMBED,
    OP_MATMUL,
    OP_ADD_BIAS,
    OP_RMSNORM,
    OP_ROPE,
    OP_KV_WRITE,
    OP_ATTENTION,
    OP_SWIGLU,
    OP_ADD,
    OP_GATHER_ROWS,
    OP_SYNC,
    OP_ARGMAX,
    OP_STEP_BEGIN,
    OP_STEP_END,
    OP_MATMUL_N,
    OP_ROPE_KV,
    OP_WEIGHT_SHADOW,
    OP_COUNT
};

static const char *const op_names[] = {
    "buf_alloc",     "buf_wrap",   "buf_upload", "buf_download", "buf_zero",    "reserve",
    "batch_prepare", "embed",      "matmul",     "add_bias",     "rmsnorm",     "rope",
    "kv_write",      "attention",  "swiglu",     "add",          "gather_rows", "sync",
    "argmax",        "step_begin", "step_end",   "matmul_n",     "rope_kv",     "weight_shadow"};
_Static_assert(sizeof op_names / sizeof op_names[0] == OP_COUNT, "one name per op");

typedef struct {
    md_backend base;
    md_backend_ops ops; /* fault_ops, plus the step ops with record=1 */
    md_backend *in;     /* the CPU backend doing the work (owned) */
    int op;             /* OP_* to fail, OP_NONE for none */
    long after;         /* the after-th call of op fails */
    long step;          /* 0: count from open; S: count within the S-th forward pass */
    int sticky, nan;
    int record; /* offer step_begin / step_end */
    int fused;  /* offer matmul_n and rope_kv */
    int shadow; /* offer weight_shadow (counted; the CPU multiplies as before) */
    long seqs, step_tokens; /* default_max_seqs / default_step_tokens (0: the CPU's) */
    int oom;    /* kind=oom: the failure is MD_ENOMEM, as cudaErrorMemoryAllocation */
    int hang;   /* kind=hang: the op blocks until fault_backend_release(), then fails */
    long calls; /* calls of op counted so far */
    long steps; /* batch_prepare calls so far */
    int tripped;
    md_err failed;          /* sticky error; code 0 until tripped with sticky=1 */
    int n_tokens, n_logits; /* of the last prepared batch, to size NaN outputs */
    float *nan_buf;
    size_t nan_cap; /* floats */
    char desc[256];
} fault_be;

static fault_backend_stats g_stats;
static int g_released; /* fault_backend_release() was called (atomic) */

void fault_backend_release(void) {
    __atomic_store_n(&g_released, 1, __ATOMIC_RELEASE);
}

static void stat_add(long *v, long d) {
    __atomic_fetch_add(v, d, __ATOMIC_RELAXED);
}

void fault_backend_get_stats(fault_backend_stats *st) {
    st->opened = __atomic_load_n(&g_stats.opened, __ATOMIC_RELAXED);
    st->freed = __atomic_load_n(&g_stats.freed, __ATOMIC_RELAXED);
    st->steps = __atomic_load_n(&g_stats.steps, __ATOMIC_RELAXED);
    st->injected = __atomic_load_n(&g_stats.injected, __ATOMIC_RELAXED);
    st->refused = __atomic_load_n(&g_stats.refused, __ATOMIC_RELAXED);
    st->live_bufs = __atomic_load_n(&g_stats.live_bufs, __ATOMIC_RELAXED);
    st->shadows = __atomic_load_n(&g_stats.shadows, __ATOMIC_RELAXED);
    st->shadow_bytes = __atomic_load_n(&g_stats.shadow_bytes, __ATOMIC_RELAXED);
    st->hanging = __atomic_load_n(&g_stats.hanging, __ATOMIC_RELAXED);
}

static fault_be *fb(md_backend *be) {
    return (fault_be *)be;
}

/* Before op `op` runs: 0 to run it, or the error that fails it. *nan_out is set when the op
 * must run and then have its output overwritten with NaN. The sentence imitates
 * kernels/cuda/ctx.cu: "CUDA device %d: %s failed: %s (%s)". */
static int gate(fault_be *f, int op, int *nan_out, md_err *e) {
    if (nan_out)
        *nan_out = 0;
    if (f->failed.code) {
        stat_add(&g_stats.refused, 1);
        if (e)
            *e = f->failed;
        return f->failed.code;
    }
    if (op == OP_BATCH_PREPARE) {
        f->steps++;
        stat_add(&g_stats.steps, 1);
        if (f->step && f->op != OP_BATCH_PREPARE)
            f->calls = 0; /* a new pass: counting restarts inside the chosen step only */
    }
    if (op != f->op || f->tripped)
        return 0;
    if (f->step && f->op != OP_BATCH_PREPARE && f->steps != f->step)
        return 0;
    if (++f->calls != f->after)
        return 0;
    f->tripped = 1;
    stat_add(&g_stats.injected, 1);
    if (f->nan) {
        if (nan_out)
            *nan_out = 1;
        return 0;
    }
    md_err mine;
    md_err *t = e ? e : &mine;
    if (f->hang) { /* a kernel that never finishes, until the test lets it go */
        stat_add(&g_stats.hanging, 1);
        while (!__atomic_load_n(&g_released, __ATOMIC_ACQUIRE)) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        stat_add(&g_stats.hanging, -1);
        md_errf(t, MD_EDEVICE,
                "CUDA device 0: %s failed: the launch timed out and was terminated "
                "(cudaErrorLaunchTimeout)",
                op_names[op]);
    } else if (f->oom)
        md_errf(t, MD_ENOMEM, "CUDA device 0: %s failed: out of memory (cudaErrorMemoryAllocation)",
                op_names[op]);
    else
        md_errf(t, MD_EDEVICE,
                "CUDA device 0: %s failed: an illegal memory access was encountered "
                "(cudaErrorIllegalAddress)",
                op_names[op]);
    if (f->sticky)
        f->failed = *t;
    return t->code;
}

/* Overwrite n floats of b with NaN (through the wrapped backend's upload). */
static int poison(fault_be *f, md_buf *b, size_t n, md_err *e) {
    if (n > f->nan_cap) {
        float *p = realloc(f->nan_buf, n * sizeof *p);
        if (!p)
            return md_errf(e, MD_ENOMEM, "fault backend: out of memory for %zu NaNs", n);
        for (size_t i = f->nan_cap; i < n; i++)
            p[i] = NAN;
        f->nan_buf = p;
        f->nan_cap = n;
    }
    return f->in->ops->buf_upload(f->in, b, 0, f->nan_buf, n * sizeof(float), e);
}

/* Forward op NAME with args to the wrapped backend, after the gate. */
#define FWD(be, OPC, NAME, ...)                                                                    \
    do {                                                                                           \
        fault_be *f_ = fb(be);                                                                     \
        int rc_ = gate(f_, OPC, NULL, e);                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
        return f_->in->ops->NAME(f_->in, __VA_ARGS__);                                             \
    } while (0)

/* The same for an op with a float output of n_out elements in buffer out. */
#define FWD_OUT(be, OPC, NAME, out, n_out, ...)                                                    \
    do {                                                                                           \
        fault_be *f_ = fb(be);                                                                     \
        int nan_ = 0, rc_ = gate(f_, OPC, &nan_, e);                                               \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
        rc_ = f_->in->ops->NAME(f_->in, __VA_ARGS__);                                              \
        if (rc_ == 0 && nan_)                                                                      \
            rc_ = poison(f_, (out), (size_t)(n_out), e);                                           \
        return rc_;                                                                                \
    } while (0)

static void f_free(md_backend *be) {
    fault_be *f = fb(be);
    md_backend_free(f->in);
    free(f->nan_buf);
    free(f);
    __atomic_fetch_add(&g_stats.freed, 1, __ATOMIC_RELAXED);
}

static const char *f_describe(md_backend *be) {
    return fb(be)->desc;
}

static int f_buf_alloc(md_backend *be, size_t bytes, md_buf **out, md_err *e) {
    fault_be *f = fb(be);
    int rc = gate(f, OP_BUF_ALLOC, NULL, e);
    if (rc == 0 && (rc = f->in->ops->buf_alloc(f->in, bytes, out, e)) == 0)
        stat_add(&g_stats.live_bufs, 1);
    return rc;
}

static int f_buf_wrap(md_backend *be, const void *host, size_t bytes, md_buf **out, md_err *e) {
    fault_be *f = fb(be);
    int rc = gate(f, OP_BUF_WRAP, NULL, e);
    if (rc == 0 && (rc = f->in->ops->buf_wrap(f->in, host, bytes, out, e)) == 0)
        stat_add(&g_stats.live_bufs, 1);
    return rc;
}

/* A weight in the wrapped backend's layout (its repacked weights), faulted as buf_wrap. */
static int f_weight_wrap(md_backend *be, const void *host, size_t bytes, int type, int64_t ne0,
                         int64_t ne1, void (*done)(void *, const void *, size_t), void *done_ctx,
                         md_buf **out, int *copied, md_err *e) {
    fault_be *f = fb(be);
    *copied = 0;
    int rc = gate(f, OP_BUF_WRAP, NULL, e);
    if (rc == 0)
        rc = f->in->ops->weight_wrap
                 ? f->in->ops->weight_wrap(f->in, host, bytes, type, ne0, ne1, done, done_ctx,
                                           out, copied, e)
                 : f->in->ops->buf_wrap(f->in, host, bytes, out, e);
    if (rc == 0)
        stat_add(&g_stats.live_bufs, 1);
    return rc;
}

/* Freeing works whatever state the device is in (as cudaFree on a failed context returns
 * its error but the engine must still be able to tear down). */
static void f_buf_free(md_backend *be, md_buf *b) {
    fault_be *f = fb(be);
    f->in->ops->buf_free(f->in, b);
    stat_add(&g_stats.live_bufs, -1);
}

static int f_buf_upload(md_backend *be, md_buf *dst, size_t off, const void *src, size_t n,
                        md_err *e) {
    FWD(be, OP_BUF_UPLOAD, buf_upload, dst, off, src, n, e);
}

static int f_buf_download(md_backend *be, const md_buf *src, size_t off, void *dst, size_t n,
                          md_err *e) {
    FWD(be, OP_BUF_DOWNLOAD, buf_download, src, off, dst, n, e);
}

static int f_buf_zero(md_backend *be, md_buf *b, size_t off, size_t n, md_err *e) {
    FWD(be, OP_BUF_ZERO, buf_zero, b, off, n, e);
}

static int f_reserve(md_backend *be, const md_reserve *r, md_err *e) {
    FWD(be, OP_RESERVE, reserve, r, e);
}

static int f_batch_prepare(md_backend *be, const md_batch *b, md_err *e) {
    fault_be *f = fb(be);
    int rc = gate(f, OP_BATCH_PREPARE, NULL, e);
    if (rc)
        return rc;
    f->n_tokens = b->n_tokens;
    f->n_logits = b->n_logits;
    return f->in->ops->batch_prepare(f->in, b, e);
}

static int f_embed(md_backend *be, const md_tensor *w, md_buf *out, md_err *e) {
    FWD_OUT(be, OP_EMBED, embed, out, (size_t)fb(be)->n_tokens * w->ne0, w, out, e);
}

static int f_matmul(md_backend *be, const md_tensor *w, const md_buf *x, md_buf *y, int T,
                    md_err *e) {
    FWD_OUT(be, OP_MATMUL, matmul, y, (size_t)T * w->ne1, w, x, y, T, e);
}

static int f_matmul_n(md_backend *be, int n, const md_tensor *const *w, const md_buf *x,
                      md_buf *const *y, int T, int mode, md_err *e) {
    FWD_OUT(be, OP_MATMUL_N, matmul_n, y[0], (size_t)T * w[0]->ne1, n, w, x, y, T, mode, e);
}

static int f_rope_kv(md_backend *be, md_buf *q, md_buf *k, const md_buf *v, md_buf *k_cache,
                     md_buf *v_cache, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                     const md_buf *inv_freq, int neox, int cache_type, md_err *e) {
    FWD_OUT(be, OP_ROPE_KV, rope_kv, q, (size_t)fb(be)->n_tokens * n_heads * head_dim, q, k, v,
            k_cache, v_cache, n_heads, n_kv_heads, head_dim, rot_dims, inv_freq, neox, cache_type,
            e);
}

/* Counts the copies the engine asks for; the wrapped CPU backend has no use for them. */
static int f_weight_shadow(md_backend *be, const md_tensor *w, md_err *e) {
    int rc = gate(fb(be), OP_WEIGHT_SHADOW, NULL, e);
    if (rc)
        return rc;
    stat_add(&g_stats.shadows, 1);
    if (w->type != MD_TYPE_F32 && w->type != MD_TYPE_F16 && w->type != MD_TYPE_BF16)
        stat_add(&g_stats.shadow_bytes, (long)(w->ne0 * w->ne1 * 2));
    return 0;
}

static int f_add_bias(md_backend *be, md_buf *y, const md_tensor *bias, int T, md_err *e) {
    FWD_OUT(be, OP_ADD_BIAS, add_bias, y, (size_t)T * bias->ne0, y, bias, T, e);
}

static int f_rmsnorm(md_backend *be, const md_buf *x, const md_tensor *w, md_buf *out, int T, int C,
                     float eps, md_err *e) {
    FWD_OUT(be, OP_RMSNORM, rmsnorm, out, (size_t)T * C, x, w, out, T, C, eps, e);
}

static int f_rope(md_backend *be, md_buf *x, int n_heads, int head_dim, int rot_dims,
                  const md_buf *inv_freq, int neox, md_err *e) {
    FWD_OUT(be, OP_ROPE, rope, x, (size_t)fb(be)->n_tokens * n_heads * head_dim, x, n_heads,
            head_dim, rot_dims, inv_freq, neox, e);
}

static int f_kv_write(md_backend *be, const md_buf *k, const md_buf *v, md_buf *k_cache,
                      md_buf *v_cache, int kv_dim, int cache_type, md_err *e) {
    FWD(be, OP_KV_WRITE, kv_write, k, v, k_cache, v_cache, kv_dim, cache_type, e);
}

static int f_attention(md_backend *be, const md_buf *q, const md_buf *k_cache,
                       const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                       int head_dim, int cache_type, float scale, md_err *e) {
    FWD_OUT(be, OP_ATTENTION, attention, out, (size_t)fb(be)->n_tokens * n_heads * head_dim, q,
            k_cache, v_cache, out, n_heads, n_kv_heads, head_dim, cache_type, scale, e);
}

static int f_swiglu(md_backend *be, const md_buf *gate_, const md_buf *up, md_buf *out, int64_t n,
                    md_err *e) {
    FWD_OUT(be, OP_SWIGLU, swiglu, out, n, gate_, up, out, n, e);
}

static int f_add(md_backend *be, md_buf *x, const md_buf *y, int64_t n, md_err *e) {
    FWD_OUT(be, OP_ADD, add, x, n, x, y, n, e);
}

static int f_gather_rows(md_backend *be, const md_buf *x, md_buf *out, int C, md_err *e) {
    FWD_OUT(be, OP_GATHER_ROWS, gather_rows, out, (size_t)fb(be)->n_logits * C, x, out, C, e);
}

static int f_sync(md_backend *be, md_err *e) {
    FWD(be, OP_SYNC, sync, e);
}

static int f_check_fits(md_backend *be, size_t need_bytes, const char *what, md_err *e) {
    fault_be *f = fb(be);
    if (!f->in->ops->check_fits)
        return 0;
    return f->in->ops->check_fits(f->in, need_bytes, what, e);
}

static int f_argmax(md_backend *be, const md_buf *x, int rows, int n, int32_t *out, md_err *e) {
    FWD(be, OP_ARGMAX, argmax, x, rows, n, out, e);
}

/* record=1: the engine brackets each forward pass with these (as for kernels/cuda's graphs);
 * the ops still run directly, so only the bracketing and its error path are exercised. A
 * failing step_end is a recorded pass whose launch failed. */
static int f_step_begin(md_backend *be, md_err *e) {
    return gate(fb(be), OP_STEP_BEGIN, NULL, e);
}

static int f_step_end(md_backend *be, int failed, md_err *e) {
    (void)failed;
    return gate(fb(be), OP_STEP_END, NULL, e);
}

/* With record=1 an instance's copy adds step_begin/step_end, with fused=1 matmul_n and
 * rope_kv, with shadow=1 weight_shadow; kv_cache_type is the wrapped
 * CPU backend's. */
static const md_backend_ops fault_ops = {
    .name = "faulty",
    .free = f_free,
    .describe = f_describe,
    .buf_alloc = f_buf_alloc,
    .buf_wrap = f_buf_wrap,
    .weight_wrap = f_weight_wrap,
    .buf_free = f_buf_free,
    .buf_upload = f_buf_upload,
    .buf_download = f_buf_download,
    .buf_zero = f_buf_zero,
    .reserve = f_reserve,
    .batch_prepare = f_batch_prepare,
    .embed = f_embed,
    .matmul = f_matmul,
    .add_bias = f_add_bias,
    .rmsnorm = f_rmsnorm,
    .rope = f_rope,
    .kv_write = f_kv_write,
    .attention = f_attention,
    .swiglu = f_swiglu,
    .add = f_add,
    .gather_rows = f_gather_rows,
    .sync = f_sync,
    .check_fits = f_check_fits,
    .argmax = f_argmax,
};

static int parse_long(const char *s, size_t n, long lo, long *out) {
    char buf[32];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno || *end || v < lo || v > 1000000000L)
        return -1;
    *out = v;
    return 0;
}

static int parse_spec(fault_be *f, const char *device, long *threads, md_err *e) {
    f->op = OP_NONE;
    f->after = 1;
    const char *p = strchr(device, ':');
    if (!p)
        return md_errf(e, MD_EINVAL, "device \"%s\": expected faulty:op=OP[,after=N,...]", device);
    p++;
    while (*p) {
        size_t n = strcspn(p, ",");
        const char *eq = memchr(p, '=', n);
        if (!eq)
            return md_errf(e, MD_EINVAL, "device \"%s\": \"%.*s\" is not key=value", device, (int)n,
                           p);
        size_t kn = (size_t)(eq - p), vn = n - kn - 1;
        const char *v = eq + 1;
        long num = 0;
        int ok = 1;
        if (kn == 2 && !memcmp(p, "op", 2)) {
            ok = 0;
            if (vn == 4 && !memcmp(v, "none", 4)) {
                f->op = OP_NONE;
                ok = 1;
            }
            for (int i = 0; i < OP_COUNT && !ok; i++)
                if (strlen(op_names[i]) == vn && !memcmp(op_names[i], v, vn)) {
                    f->op = i;
                    ok = 1;
                }
        } else if (kn == 5 && !memcmp(p, "after", 5)) {
            ok = parse_long(v, vn, 1, &f->after) == 0;
        } else if (kn == 4 && !memcmp(p, "step", 4)) {
            ok = parse_long(v, vn, 1, &f->step) == 0;
        } else if (kn == 6 && !memcmp(p, "sticky", 6)) {
            ok = parse_long(v, vn, 0, &num) == 0 && num <= 1;
            f->sticky = (int)num;
        } else if (kn == 4 && !memcmp(p, "kind", 4)) {
            ok = (vn == 5 && !memcmp(v, "error", 5)) || (vn == 3 && !memcmp(v, "nan", 3)) ||
                 (vn == 3 && !memcmp(v, "oom", 3)) || (vn == 4 && !memcmp(v, "hang", 4));
            f->nan = vn == 3 && !memcmp(v, "nan", 3);
            f->oom = vn == 3 && !memcmp(v, "oom", 3);
            f->hang = vn == 4 && !memcmp(v, "hang", 4);
        } else if (kn == 6 && !memcmp(p, "record", 6)) {
            ok = parse_long(v, vn, 0, &num) == 0 && num <= 1;
            f->record = (int)num;
        } else if (kn == 6 && !memcmp(p, "shadow", 6)) {
            ok = parse_long(v, vn, 0, &num) == 0 && num <= 1;
            f->shadow = (int)num;
        } else if (kn == 5 && !memcmp(p, "fused", 5)) {
            ok = parse_long(v, vn, 0, &num) == 0 && num <= 1;
            f->fused = (int)num;
        } else if (kn == 4 && !memcmp(p, "seqs", 4)) {
            ok = parse_long(v, vn, 1, &f->seqs) == 0 && f->seqs <= 65536;
        } else if (kn == 10 && !memcmp(p, "steptokens", 10)) {
            ok = parse_long(v, vn, 1, &f->step_tokens) == 0 && f->step_tokens <= 65536;
        } else if (kn == 7 && !memcmp(p, "threads", 7)) {
            ok = parse_long(v, vn, 1, threads) == 0;
        } else {
            return md_errf(e, MD_EINVAL, "device \"%s\": unknown key \"%.*s\"", device, (int)kn, p);
        }
        if (!ok)
            return md_errf(e, MD_EINVAL, "device \"%s\": bad value in \"%.*s\"", device, (int)n, p);
        p += n;
        if (*p == ',')
            p++;
    }
    if (f->step && f->op == OP_BATCH_PREPARE)
        return md_errf(e, MD_EINVAL, "device \"%s\": step= with op=batch_prepare (use after=S)",
                       device);
    if (f->nan && (f->op == OP_BUF_ALLOC || f->op == OP_BUF_WRAP || f->op == OP_BUF_UPLOAD ||
                   f->op == OP_BUF_DOWNLOAD || f->op == OP_BUF_ZERO || f->op == OP_RESERVE ||
                   f->op == OP_BATCH_PREPARE || f->op == OP_KV_WRITE || f->op == OP_SYNC ||
                   f->op == OP_ARGMAX || f->op == OP_STEP_BEGIN || f->op == OP_STEP_END ||
                   f->op == OP_WEIGHT_SHADOW))
        return md_errf(e, MD_EINVAL, "device \"%s\": kind=nan needs an op with a float output",
                       device);
    return 0;
}

int fault_backend_open(const char *device, int n_threads, md_backend **out, md_err *e) {
    *out = NULL;
    fault_be *f = calloc(1, sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "fault backend: out of memory");
    long threads = n_threads;
    int rc = parse_spec(f, device, &threads, e);
    if (rc == 0)
        rc = md_backend_cpu_open((int)threads, &f->in, e);
    if (rc) {
        free(f);
        return rc;
    }
    if ((f->op == OP_STEP_BEGIN || f->op == OP_STEP_END) && !f->record) {
        md_backend_free(f->in);
        free(f);
        return md_errf(e, MD_EINVAL, "device \"%s\": op=step_begin/step_end needs record=1",
                       device);
    }
    if (f->op == OP_WEIGHT_SHADOW && !f->shadow) {
        md_backend_free(f->in);
        free(f);
        return md_errf(e, MD_EINVAL, "device \"%s\": op=weight_shadow needs shadow=1", device);
    }
    if ((f->op == OP_MATMUL_N || f->op == OP_ROPE_KV) && !f->fused) {
        md_backend_free(f->in);
        free(f);
        return md_errf(e, MD_EINVAL, "device \"%s\": op=matmul_n/rope_kv needs fused=1", device);
    }
    f->ops = fault_ops;
    f->ops.kv_cache_type = f->in->ops->kv_cache_type;
    f->ops.default_max_seqs = f->seqs ? (int)f->seqs : f->in->ops->default_max_seqs;
    f->ops.default_step_tokens =
        f->step_tokens ? (int)f->step_tokens : f->in->ops->default_step_tokens;
    if (f->record) {
        f->ops.step_begin = f_step_begin;
        f->ops.step_end = f_step_end;
    }
    if (f->fused) {
        f->ops.matmul_n = f_matmul_n;
        f->ops.rope_kv = f_rope_kv;
    }
    if (f->shadow)
        f->ops.weight_shadow = f_weight_shadow;
    f->base.ops = &f->ops;
    snprintf(f->desc, sizeof f->desc, "%s over %s", device, f->in->ops->describe(f->in));
    __atomic_fetch_add(&g_stats.opened, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.steps, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.injected, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.refused, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.live_bufs, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.shadows, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_stats.shadow_bytes, 0, __ATOMIC_RELAXED);
    *out = &f->base;
    return 0;
}

int fault_backend_register(md_err *e) {
    return md_backend_register("faulty", fault_backend_open, e);
}
