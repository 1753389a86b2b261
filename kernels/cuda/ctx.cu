/* ctx.cu — one CUDA device as a cuda_ctx: selection and queries, the stream and cuBLAS
 * handle, the sticky error, the device memory pool, copies and CUDA graph capture.
 *
 * The pool: cudaMalloc'd slabs (never managed memory), each a sorted list of segments;
 * allocation is first-fit in 256-byte units, freeing merges with free neighbours. Large
 * requests (weights) get a slab of their own size so nothing is wasted at load; small
 * ones share 64 MiB slabs. Slabs go back to the driver only at cuda_ctx_close.
 * MEDLEY_CUDA_POOL_EXACT=1 (for memory checkers): a slab per allocation, of exactly its
 * size, freed with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"

#define POOL_ALIGN 256
#define POOL_SLAB (64u << 20)
#define GIB (1024.0 * 1024.0 * 1024.0)

struct cuda_seg {
    size_t off, size;
    int free;
    cuda_seg *next;
};

struct cuda_slab {
    char *base;
    size_t size;
    cuda_seg *segs;
    cuda_slab *next;
};

struct cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

/* Inside a capture nothing runs, so a failure there is the capture's (an operation graphs
 * do not allow, a launch refused): it is kept apart from the sticky error, the capture is
 * dropped and the step runs directly, where a real device fault shows again. */
static int capture_fail(cuda_ctx *c, const char *what, const char *why, md_err *e) {
    if (!c->capture_failed.code)
        md_errf(&c->capture_failed, MD_EDEVICE,
                "CUDA device %d: %s failed while recording a graph: %s", c->ordinal, what, why);
    if (e)
        *e = c->capture_failed;
    return MD_EDEVICE;
}

int cuda_fail(cuda_ctx *c, cudaError_t err, const char *what, md_err *e) {
    if (c && c->capturing)
        return capture_fail(c, what, cudaGetErrorString(err), e);
    if (c && !c->failed.code)
        md_errf(&c->failed, MD_EDEVICE, "CUDA device %d: %s failed: %s (%s)", c->ordinal, what,
                cudaGetErrorString(err), cudaGetErrorName(err));
    if (c) {
        if (e)
            *e = c->failed;
        return MD_EDEVICE;
    }
    return md_errf(e, MD_EDEVICE, "CUDA: %s failed: %s", what, cudaGetErrorString(err));
}

static const char *blas_name(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

int cuda_fail_blas(cuda_ctx *c, cublasStatus_t st, const char *what, md_err *e) {
    if (c->capturing)
        return capture_fail(c, what, blas_name(st), e);
    if (!c->failed.code)
        md_errf(&c->failed, MD_EDEVICE, "CUDA device %d: cuBLAS %s failed: %s (status %d)",
                c->ordinal, what, blas_name(st), (int)st);
    if (e)
        *e = c->failed;
    return MD_EDEVICE;
}

int cuda_ctx_failed(const cuda_ctx *c, md_err *e) {
    if (!c->failed.code)
        return 0;
    if (e)
        *e = c->failed;
    return c->failed.code;
}

int cuda_check(cuda_ctx *c, const char *what, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return cuda_fail(c, err, what, e);
    return 0;
}

int cuda_sync(cuda_ctx *c, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaStreamSynchronize(c->stream);
    if (err == cudaSuccess)
        err = cudaGetLastError();
    if (err != cudaSuccess)
        return cuda_fail(c, err, "stream synchronize", e);
    return 0;
}

int cuda_device_count(char *why, size_t whysz) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why)
            snprintf(why, whysz, "%s", cudaGetErrorString(err));
        cudaGetLastError(); /* not sticky: clear it so later calls start clean */
        return 0;
    }
    if (n == 0 && why)
        snprintf(why, whysz, "the driver reports no CUDA device");
    return n;
}

int cuda_device_query(int ordinal, cuda_device_info *info, md_err *e) {
    char why[256] = "";
    int n = cuda_device_count(why, sizeof why);
    if (n == 0)
        return md_errf(e, MD_EDEVICE, "no CUDA device is usable (%s); use --device cpu", why);
    if (ordinal < 0 || ordinal >= n)
        return md_errf(e, MD_EDEVICE,
                       "cuda:%d does not exist: this host has %d CUDA device%s "
                       "(cuda:0..cuda:%d)",
                       ordinal, n, n == 1 ? "" : "s", n - 1);
    cudaDeviceProp p;
    cudaError_t err = cudaGetDeviceProperties(&p, ordinal);
    if (err != cudaSuccess)
        return cuda_fail(NULL, err, "cudaGetDeviceProperties", e);
    if (p.major < 8) /* no kernel image for it (CMake builds sm_80 and newer: int8 mma.sync) */
        return md_errf(e, MD_EDEVICE,
                       "cuda:%d (%s) has compute capability %d.%d; medley's CUDA kernels need "
                       "8.0 or newer (A100, A10, L4, RTX 30/40, H100); use --device cpu",
                       ordinal, p.name, p.major, p.minor);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->ordinal = ordinal;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->n_sm = p.multiProcessorCount;
    info->total_bytes = p.totalGlobalMem;
    int clk_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, ordinal) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal) == cudaSuccess)
        info->hbm_gbps = 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* DDR: two per clock */
    cudaGetLastError();
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(ordinal) == cudaSuccess) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
            info->free_bytes = fr;
        cudaSetDevice(prev);
    }
    cudaGetLastError();
    return 0;
}

/* A path threshold from the environment: 0 (unset: the default), -1 for "0" (never), or
 * the value; MD_EINVAL naming the variable when it is not an integer in 0..hi. */
static int env_threshold(const char *name, int hi, int *out, md_err *e) {
    const char *v = getenv(name);
    *out = 0;
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > hi)
        return md_errf(e, MD_EINVAL, "%s=%s: expected an integer in 0..%d (0: never)", name, v, hi);
    *out = x == 0 ? -1 : (int)x;
    return 0;
}

int cuda_ctx_set_attn_tc(cuda_ctx *c, int on) {
    int old = c->attn_tc;
    c->attn_tc = on != 0;
    return old;
}

int cuda_ctx_open(int ordinal, cuda_ctx **out, md_err *e) {
    int gemv_max, mmq_max;
    int rc = env_threshold("MEDLEY_CUDA_GEMV_MAX_M", CUDA_GEMV_MAX_M, &gemv_max, e);
    if (rc || (rc = env_threshold("MEDLEY_CUDA_MMQ_MAX_M", 1 << 20, &mmq_max, e)))
        return rc;
    cuda_device_info info;
    rc = cuda_device_query(ordinal, &info, e);
    if (rc)
        return rc;
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return md_errf(e, MD_ENOMEM, "out of host memory opening cuda:%d", ordinal);
    c->ordinal = ordinal;
    c->gemv_max_m = gemv_max;
    c->mmq_max_m = mmq_max;
    const char *tc = getenv("MEDLEY_CUDA_ATTN_TC");
    c->attn_tc = !(tc && !strcmp(tc, "0"));
    const char *px = getenv("MEDLEY_CUDA_POOL_EXACT");
    c->pool_exact = px && *px && strcmp(px, "0");
    cudaError_t err = cudaSetDevice(ordinal);
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        rc = cuda_fail(c, err, "creating the stream", e);
        free(c);
        return rc;
    }
    cublasStatus_t st = cublasCreate(&c->cublas);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetStream(c->cublas, c->stream);
    /* A fixed workspace: cuBLAS may not allocate during graph capture. */
    c->cublas_ws_bytes = 32u << 20;
    if (st == CUBLAS_STATUS_SUCCESS) {
        err = cudaMalloc(&c->cublas_ws, c->cublas_ws_bytes);
        if (err != cudaSuccess) {
            rc = cuda_fail(c, err, "allocating the cuBLAS workspace", e);
            cuda_ctx_close(c);
            return rc;
        }
        st = cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        rc = cuda_fail_blas(c, st, "initialisation", e);
        cuda_ctx_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void cuda_ctx_close(cuda_ctx *c) {
    if (!c)
        return;
    cudaSetDevice(c->ordinal);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->cublas)
        cublasDestroy(c->cublas);
    if (c->cublas_ws)
        cudaFree(c->cublas_ws);
    for (cuda_slab *s = c->slabs, *ns; s; s = ns) {
        ns = s->next;
        for (cuda_seg *g = s->segs, *ng; g; g = ng) {
            ng = g->next;
            free(g);
        }
        cudaFree(s->base);
        free(s);
    }
    if (c->stream)
        cudaStreamDestroy(c->stream);
    cudaGetLastError();
    free(c);
}

cudaStream_t cuda_ctx_stream(cuda_ctx *c) {
    return c->stream;
}
int cuda_ctx_ordinal(const cuda_ctx *c) {
    return c->ordinal;
}
size_t cuda_pool_used(const cuda_ctx *c) {
    return c->used;
}
size_t cuda_pool_reserved(const cuda_ctx *c) {
    return c->reserved;
}

/* First fit inside one slab; splits the segment found. */
static void *slab_take(cuda_slab *s, size_t size) {
    for (cuda_seg *g = s->segs; g; g = g->next) {
        if (!g->free || g->size < size)
            continue;
        if (g->size > size) {
            cuda_seg *rest = (cuda_seg *)malloc(sizeof *rest);
            if (!rest)
                return NULL;
            rest->off = g->off + size;
            rest->size = g->size - size;
            rest->free = 1;
            rest->next = g->next;
            g->next = rest;
            g->size = size;
        }
        g->free = 0;
        return s->base + g->off;
    }
    return NULL;
}

int cuda_pool_alloc(cuda_ctx *c, size_t bytes, void **out, md_err *e) {
    CUDA_GUARD(c, e);
    if (c->capturing)
        return md_errf(e, MD_EINVAL, "cuda:%d: allocation while capturing a CUDA graph",
                       c->ordinal);
    size_t size = (bytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    if (size == 0)
        size = POOL_ALIGN;
    if (c->pool_exact) /* cudaMalloc aligns to 256 bytes by itself */
        size = bytes ? bytes : 1;
    for (cuda_slab *s = c->slabs; s && !c->pool_exact; s = s->next) {
        void *p = slab_take(s, size);
        if (p) {
            c->used += size;
            *out = p;
            return 0;
        }
    }
    size_t slab_size = size > POOL_SLAB / 2 || c->pool_exact ? size : POOL_SLAB;
    cuda_slab *s = (cuda_slab *)calloc(1, sizeof *s);
    cuda_seg *g = (cuda_seg *)calloc(1, sizeof *g);
    if (!s || !g) {
        free(s);
        free(g);
        return md_errf(e, MD_ENOMEM, "out of host memory for the device pool");
    }
    cudaSetDevice(c->ordinal);
    cudaError_t err = cudaMalloc((void **)&s->base, slab_size);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: the caller may shrink and retry */
        free(s);
        free(g);
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return md_errf(e, MD_ENOMEM,
                       "cuda:%d: cannot allocate %.3f GiB of device memory (%.3f GiB free of "
                       "%.3f GiB; %.3f GiB already held by medley): %s",
                       c->ordinal, slab_size / GIB, fr / GIB, tot / GIB, c->reserved / GIB,
                       cudaGetErrorString(err));
    }
    g->off = 0;
    g->size = slab_size;
    g->free = 1;
    s->size = slab_size;
    s->segs = g;
    s->next = c->slabs;
    c->slabs = s;
    c->reserved += slab_size;
    *out = slab_take(s, size);
    if (!*out)
        return md_errf(e, MD_ENOMEM, "out of host memory for the device pool");
    c->used += size;
    return 0;
}

void cuda_pool_free(cuda_ctx *c, void *p) {
    if (!c || !p)
        return;
    for (cuda_slab **ps = &c->slabs, *s; (s = *ps) != NULL; ps = &s->next) {
        if ((char *)p < s->base || (char *)p >= s->base + s->size)
            continue;
        if (c->pool_exact) {
            if (p != s->base || s->segs->free)
                return;
            c->used -= s->size;
            s->segs->free = 1;
            if (c->capturing) /* no cudaFree inside a capture: kept, unused, until close */
                return;
            /* after the work queued on it (exact mode is for checking: the stall does not
             * matter); a failure here is the device's, which the next call reports */
            cudaStreamSynchronize(c->stream);
            c->reserved -= s->size;
            *ps = s->next;
            free(s->segs);
            cudaFree(s->base);
            cudaGetLastError();
            free(s);
            return;
        }
        size_t off = (size_t)((char *)p - s->base);
        cuda_seg *prev = NULL;
        for (cuda_seg *g = s->segs; g; prev = g, g = g->next) {
            if (g->off != off || g->free)
                continue;
            g->free = 1;
            c->used -= g->size;
            cuda_seg *n = g->next;
            if (n && n->free) {
                g->size += n->size;
                g->next = n->next;
                free(n);
            }
            if (prev && prev->free) {
                prev->size += g->size;
                prev->next = g->next;
                free(g);
            }
            return;
        }
        return;
    }
}

int cuda_scratch(cuda_ctx *c, int which, size_t bytes, void **out, md_err *e) {
    if (c->scratch_bytes[which] < bytes) {
        void *p = NULL;
        int rc = cuda_pool_alloc(c, bytes, &p, e);
        if (rc)
            return rc;
        cuda_pool_free(c, c->scratch[which]);
        c->scratch[which] = p;
        c->scratch_bytes[which] = bytes;
        c->scratch_gen++;
    }
    *out = c->scratch[which];
    return 0;
}

int cuda_mem_info(cuda_ctx *c, size_t *avail, size_t *total, md_err *e) {
    CUDA_GUARD(c, e);
    cudaSetDevice(c->ordinal);
    size_t fr = 0, tot = 0;
    cudaError_t err = cudaMemGetInfo(&fr, &tot);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "cudaMemGetInfo", e);
    *avail = fr + (c->reserved - c->used);
    *total = tot;
    return 0;
}

int cuda_check_fits(cuda_ctx *c, size_t need, const char *what, md_err *e) {
    CUDA_GUARD(c, e);
    cudaSetDevice(c->ordinal);
    size_t fr = 0, tot = 0;
    cudaError_t err = cudaMemGetInfo(&fr, &tot);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "cudaMemGetInfo", e);
    size_t spare = c->reserved - c->used; /* upper bound: fragmentation may waste some */
    if (need > fr + spare)
        return md_errf(e, MD_ENOMEM,
                       "%s does not fit on cuda:%d: needs %.2f GiB, %.2f GiB free of %.2f GiB",
                       what, c->ordinal, need / GIB, (fr + spare) / GIB, tot / GIB);
    return 0;
}

int cuda_upload(cuda_ctx *c, void *dst, const void *src, size_t bytes, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "host-to-device copy", e);
    return 0;
}

int cuda_download(cuda_ctx *c, void *dst, const void *src, size_t bytes, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(c->stream);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "device-to-host copy", e);
    return 0;
}

int cuda_memset0(cuda_ctx *c, void *dst, size_t bytes, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaMemsetAsync(dst, 0, bytes, c->stream);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "memset", e);
    return 0;
}

unsigned cuda_ctx_scratch_gen(const cuda_ctx *c) {
    return c->scratch_gen;
}
void cuda_ctx_scratch_moved(cuda_ctx *c) {
    c->scratch_gen++;
}

int cuda_graph_begin(cuda_ctx *c, md_err *e) {
    CUDA_GUARD(c, e);
    cudaSetDevice(c->ordinal);
    cudaError_t err = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "begin graph capture", e);
    c->capturing = 1;
    memset(&c->capture_failed, 0, sizeof c->capture_failed);
    return 0;
}

void cuda_graph_abort(cuda_ctx *c) {
    if (!c->capturing)
        return;
    cudaGraph_t g = NULL;
    c->capturing = 0;
    if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
    cudaGetLastError(); /* the capture's own error, if any, is not the device's */
}

int cuda_graph_end(cuda_ctx *c, cuda_graph **out, md_err *e) {
    cudaGraph_t g = NULL;
    *out = NULL;
    if (!c->capturing)
        return md_errf(e, MD_EINVAL, "cuda:%d: no graph capture to end", c->ordinal);
    c->capturing = 0;
    cudaError_t err = cudaStreamEndCapture(c->stream, &g);
    if (c->failed.code || c->capture_failed.code || err != cudaSuccess) {
        /* a launcher failed inside the capture, or the capture itself was invalidated */
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        if (c->failed.code)
            return cuda_ctx_failed(c, e);
        if (c->capture_failed.code) {
            if (e)
                *e = c->capture_failed;
        } else {
            md_errf(e, MD_EDEVICE, "CUDA device %d: graph capture failed: %s", c->ordinal,
                    cudaGetErrorString(err));
        }
        return CUDA_ECAPTURE;
    }
    cuda_graph *cg = (cuda_graph *)calloc(1, sizeof *cg);
    if (!cg) {
        cudaGraphDestroy(g);
        return md_errf(e, MD_ENOMEM, "out of host memory for a CUDA graph");
    }
    cg->graph = g;
    err = cudaGraphInstantiate(&cg->exec, g, 0);
    if (err != cudaSuccess) {
        cudaGraphDestroy(g);
        free(cg);
        cudaGetLastError();
        md_errf(e, MD_EDEVICE, "CUDA device %d: graph instantiate failed: %s", c->ordinal,
                cudaGetErrorString(err));
        return CUDA_ECAPTURE;
    }
    *out = cg;
    return 0;
}

int cuda_graph_launch(cuda_ctx *c, cuda_graph *g, md_err *e) {
    CUDA_GUARD(c, e);
    cudaError_t err = cudaGraphLaunch(g->exec, c->stream);
    if (err != cudaSuccess)
        return cuda_fail(c, err, "graph launch", e);
    return 0;
}

void cuda_graph_free(cuda_graph *g) {
    if (!g)
        return;
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
}
