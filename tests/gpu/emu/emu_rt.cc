/* emu_rt.cc — the CUDA runtime and cuBLAS calls kernels/cuda makes, on the CPU emulator: one
 * emulated device ("medley CPU emulator", compute capability 9.0) whose global memory is the
 * host heap (cudaMalloc bounded by EMU_TOTAL_BYTES, so "does not fit" paths are real), one
 * lock-step stream model (work runs when it is issued; a stream that is capturing records
 * it instead, and a graph replays the recorded closures with the arguments they were given),
 * and cuBLAS GEMMs by their documented definition with f32 accumulation.
 *
 * It checks what a real device would refuse and a host run would not notice: launch
 * configurations (block size, grid limits, 1-D blocks as kernels/cuda uses them), calls a
 * capture does not allow in cudaStreamCaptureModeThreadLocal (cudaMalloc, cudaFree,
 * synchronizing a stream or event, a host<->device copy from pageable memory), a graph
 * launched after its capture was invalidated, and unknown handles. A fault can be injected:
 * MEDLEY_EMU_FAIL_LAUNCH=N makes the Nth kernel launch (1-based, counted from the first) a
 * sticky cudaErrorIllegalAddress, as a kernel that faulted leaves a real context.
 * MEDLEY_EMU_TRACE=1 prints every launch; MEDLEY_EMU_VERBOSE=1 every refusal.
 *
 * For tests of the backend's host logic (emu_log.h): a log of what the device executes —
 * each kernel, cuBLAS GEMM, upload and memset with its arguments, device pointers as
 * (allocation, offset), taken when it runs (a replayed graph's at the replay) — counters of
 * captures and graphs, refused capture ends on demand, and a smaller device.
 *
 * What it cannot see: concurrency between streams or with the host (there is none), memory
 * ordering beyond barriers, speed. extern "C" with the toolkit's names and ABI-compatible
 * types, so backend_cuda.c, compiled against the real cuda_runtime_api.h, calls these. */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "emu_log.h"

int emu_log_on;

namespace {

const size_t EMU_TOTAL_BYTES = (size_t)6 << 30;

typedef std::vector<std::function<void()>> op_list;

std::recursive_mutex mu; /* the device: one issuer at a time */
struct allocation {
    size_t size;
    long id; /* allocations (device and pinned) counted from the last emu_log_start */
};
std::map<const char *, allocation> dev_allocs, host_allocs;
size_t dev_used, dev_total = EMU_TOTAL_BYTES; /* emu_set_total */
long next_alloc_id = 1;
int cur_device;
long launches, fail_at = -1;
cudaError_t sticky; /* a fault: every later call fails with it, as on a real context */
thread_local cudaError_t last_err;
int n_capturing;
long capture_refusals;

/* the launch log (emu_log.h) */
std::vector<emu_launch_rec> log_recs;
emu_stats stats;
int fail_capture_every;
long capture_ends;
long frees_unlaunched; /* graphs destroyed since the last graph launch */
int replaying;         /* a graph's ops are running */
emu_log_hook_fn hook;
void *hook_arg;

void bad_pointer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bad_pointer(const char *fmt, ...) {
    if (stats.bad_pointers++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(stats.first_bad, sizeof stats.first_bad, fmt, ap);
        va_end(ap);
    }
}

/* The allocation holding p (p may be its end) in m, or m.end(). */
std::map<const char *, allocation>::iterator holding(std::map<const char *, allocation> &m,
                                                     const void *p) {
    auto it = m.upper_bound((const char *)p);
    if (it == m.begin())
        return m.end();
    --it;
    return (const char *)p <= it->first + it->second.size ? it : m.end();
}

/* (id << EMU_PTR_SHIFT | offset) of a pointer into a live allocation, else -1. */
int64_t norm_ptr(const void *p) {
    for (auto *m : {&dev_allocs, &host_allocs}) {
        auto it = holding(*m, p);
        if (it != m->end())
            return (int64_t)it->second.id << EMU_PTR_SHIFT | ((const char *)p - it->first);
    }
    return -1;
}

/* Append what runs now to the log; pointer arguments must lie in live allocations. */
void log_push(const char *name, const std::vector<emu_arg> &args, dim3 grid, unsigned block) {
    emu_launch_rec r;
    memset(&r, 0, sizeof r);
    const char *n = name[0] == '(' ? name + 1 : name; /* "(k_gemv_n<T, 1>)" from a macro */
    snprintf(r.name, sizeof r.name, "%.*s", (int)strcspn(n, "<)"), n);
    r.grid[0] = grid.x;
    r.grid[1] = grid.y;
    r.grid[2] = grid.z;
    r.block = block;
    r.from_graph = replaying;
    r.step = stats.events;
    for (const emu_arg &a : args) {
        if (r.n_args == EMU_LOG_MAX_ARGS)
            break;
        int64_t v = (int64_t)a.v;
        if (a.kind != EMU_ARG_VALUE && a.v) {
            int64_t q = norm_ptr((const void *)(uintptr_t)a.v);
            if (q >= 0)
                v = q;
            else if (a.kind == EMU_ARG_PTR)
                bad_pointer("%s (step %ld%s): argument %d = %p is not in a live allocation", r.name,
                            r.step, replaying ? ", from a graph" : "", r.n_args,
                            (void *)(uintptr_t)a.v);
        }
        r.a[r.n_args++] = v;
    }
    log_recs.push_back(r);
    if (hook)
        hook(&log_recs.back(), hook_arg);
}

uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h ^ n;
}

cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess)
        last_err = e;
    return e;
}

}  // namespace

struct emu_stream {
    int capturing;
    int invalidated;
    op_list ops;
};
struct emu_event {
    int id;
};
struct emu_graph {
    op_list ops;
};
struct emu_blas {
    cudaStream_t stream;
};

namespace {

/* Inside a capture (ThreadLocal mode), an unsafe call invalidates every capture of the
 * thread and fails, as the runtime does. */
std::vector<emu_stream *> streams;

cudaError_t refuse_in_capture(const char *what) {
    if (!n_capturing)
        return cudaSuccess;
    capture_refusals++;
    if (getenv("MEDLEY_EMU_VERBOSE"))
        fprintf(stderr, "emu: %s while a stream is capturing: refused\n", what);
    for (emu_stream *s : streams)
        if (s->capturing)
            s->invalidated = 1;
    return set_err(cudaErrorStreamCaptureUnsupported);
}

int is_known_stream(cudaStream_t s) {
    if (!s)
        return 1; /* the legacy default stream */
    for (emu_stream *x : streams)
        if (x == s)
            return 1;
    return 0;
}

/* Issue op on stream s: run it now, or record it while s captures. */
cudaError_t issue(cudaStream_t s, std::function<void()> op) {
    if (sticky)
        return set_err(sticky);
    if (!is_known_stream(s))
        return set_err(cudaErrorInvalidResourceHandle);
    if (s && s->capturing) {
        s->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    if (n_capturing) /* the legacy stream while another one captures */
        return refuse_in_capture("work on an unrelated stream");
    op();
    return cudaSuccess;
}

int is_in(std::map<const char *, allocation> &m, const void *p, size_t bytes) {
    const char *c = (const char *)p;
    auto it = m.upper_bound(c);
    if (it == m.begin())
        return 0;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second.size;
}

int is_pinned_or_device(const void *p, size_t bytes) {
    return is_in(dev_allocs, p, bytes) || is_in(host_allocs, p, bytes);
}

/* 256-byte aligned as cudaMalloc's. Under AddressSanitizer exactly `bytes` long, so a
 * kernel reading or writing past a buffer's end is reported where it happens (with
 * MEDLEY_CUDA_POOL_EXACT=1 the pool asks for every buffer on its own). */
void *aligned(size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    void *q = nullptr;
    return posix_memalign(&q, 256, bytes ? bytes : 1) ? nullptr : q;
#else
    return aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
#endif
}

}  // namespace

void emu_submit(const emu_cfg_t &c, const char *name, std::function<void()> kernel,
                std::vector<emu_arg> args) {
    std::lock_guard<std::recursive_mutex> g(mu);
    static int trace = -1;
    if (trace < 0)
        trace = getenv("MEDLEY_EMU_TRACE") != nullptr;
    if (trace)
        fprintf(stderr, "emu: %s%s grid (%u,%u,%u) block %u\n", c.stream && c.stream->capturing ? "record " : "", name, c.grid.x,
                c.grid.y, c.grid.z, c.block.x);
    if (sticky) {
        set_err(sticky);
        return;
    }
    dim3 gr = c.grid, bl = c.block;
    if (bl.x == 0 || bl.y != 1 || bl.z != 1 || bl.x > 1024 || gr.x == 0 || gr.y == 0 ||
        gr.z == 0 || gr.y > 65535 || gr.z > 65535 || gr.x > 0x7fffffffu || c.smem > 48 * 1024) {
        if (getenv("MEDLEY_EMU_VERBOSE"))
            fprintf(stderr, "emu: launch of %s refused: grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n",
                    name, gr.x, gr.y, gr.z, bl.x, bl.y, bl.z, c.smem);
        set_err(cudaErrorInvalidConfiguration);
        return;
    }
    issue(c.stream, [gr, bl, kernel, name, args] {
        if (fail_at < 0) {
            const char *v = getenv("MEDLEY_EMU_FAIL_LAUNCH");
            fail_at = v && *v ? atol(v) : 0;
        }
        if (sticky)
            return;
        if (emu_log_on)
            log_push(name, args, gr, bl.x);
        if (fail_at > 0 && ++launches == fail_at) {
            sticky = cudaErrorIllegalAddress;
            last_err = sticky;
            return;
        }
        emu_launch(gr, bl, kernel);
    });
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) {
    const char *v = getenv("MEDLEY_EMU_DEVICES");
    *n = v && *v ? atoi(v) : 1;
    if (*n <= 0) {
        *n = 0;
        return set_err(cudaErrorNoDevice);
    }
    return cudaSuccess;
}

static cudaError_t check_ordinal(int ordinal) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return last_err;
    return ordinal >= 0 && ordinal < n ? cudaSuccess : set_err(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int ordinal) {
    if (check_ordinal(ordinal))
        return last_err;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "medley CPU emulator");
    p->totalGlobalMem = dev_total;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 8;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int ordinal) {
    if (check_ordinal(ordinal))
        return last_err;
    if (a == cudaDevAttrMemoryClockRate)
        *v = 1000000; /* kHz: with 512 bits, 256 GB/s */
    else if (a == cudaDevAttrGlobalMemoryBusWidth)
        *v = 1024;
    else
        return set_err(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *ordinal) {
    *ordinal = cur_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int ordinal) {
    if (check_ordinal(ordinal))
        return last_err;
    cur_device = ordinal;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (sticky)
        return set_err(sticky);
    *total_bytes = dev_total;
    *free_bytes = dev_total > dev_used ? dev_total - dev_used : 0;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_err;
    last_err = sticky; /* a fault stays; anything else is cleared by reading it */
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    return last_err;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "operation not permitted when stream is capturing";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "unknown error";
    }
}

const char *cudaGetErrorName(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (sticky)
        return set_err(sticky);
    *s = new emu_stream{};
    streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) {
            if (s->capturing)
                n_capturing--;
            streams.erase(streams.begin() + (long)i);
            delete s;
            return cudaSuccess;
        }
    return set_err(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!is_known_stream(s))
        return set_err(cudaErrorInvalidResourceHandle);
    if (n_capturing)
        return refuse_in_capture("cudaStreamSynchronize");
    return sticky ? set_err(sticky) : cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(mu);
    *p = nullptr;
    if (sticky)
        return set_err(sticky);
    if (n_capturing)
        return refuse_in_capture("cudaMalloc");
    if (dev_used > dev_total || bytes > dev_total - dev_used)
        return set_err(cudaErrorMemoryAllocation);
    void *q = aligned(bytes);
    if (!q)
        return set_err(cudaErrorMemoryAllocation);
    memset(q, 0xa5, bytes); /* cudaMalloc does not clear: neither do we (0xa5 is NaN-ish noise) */
    dev_allocs[(const char *)q] = allocation{bytes, next_alloc_id++};
    dev_used += bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!p)
        return cudaSuccess;
    if (n_capturing)
        return refuse_in_capture("cudaFree");
    auto it = dev_allocs.find((const char *)p);
    if (it == dev_allocs.end())
        return set_err(cudaErrorInvalidValue);
    dev_used -= it->second.size;
    dev_allocs.erase(it);
    free(p);
    return sticky ? set_err(sticky) : cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(mu);
    *p = nullptr;
    if (n_capturing)
        return refuse_in_capture("cudaMallocHost");
    void *q = aligned(bytes);
    if (!q)
        return set_err(cudaErrorMemoryAllocation);
    host_allocs[(const char *)q] = allocation{bytes, next_alloc_id++};
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!p)
        return cudaSuccess;
    if (n_capturing)
        return refuse_in_capture("cudaFreeHost");
    auto it = host_allocs.find((const char *)p);
    if (it == host_allocs.end())
        return set_err(cudaErrorInvalidValue);
    host_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (bytes && (!dst || !src))
        return set_err(cudaErrorInvalidValue);
    if (s && s->capturing && (!is_pinned_or_device(dst, bytes) || !is_pinned_or_device(src, bytes)))
        return refuse_in_capture("a copy to or from pageable host memory");
    if (kind == cudaMemcpyHostToDevice && !is_pinned_or_device(dst, bytes))
        return set_err(cudaErrorInvalidValue); /* not device memory: a bad pointer */
    if (kind == cudaMemcpyDeviceToHost && !is_pinned_or_device(src, bytes))
        return set_err(cudaErrorInvalidValue);
    /* the log's record: the bytes' hash when they come from pageable memory (pinned staging
     * may be rewritten once the copy is done; the kernels that read it are compared instead) */
    uint64_t h = emu_log_on && kind == cudaMemcpyHostToDevice && !is_in(host_allocs, src, bytes)
                     ? hash_bytes(src, bytes)
                     : 0;
    return issue(s, [dst, src, bytes, kind, h] {
        if (emu_log_on && kind == cudaMemcpyHostToDevice)
            log_push("memcpyHtoD",
                     {{(uint64_t)(uintptr_t)dst, EMU_ARG_PTR},
                      {bytes, EMU_ARG_VALUE},
                      {h, EMU_ARG_VALUE}},
                     dim3(), 0);
        memmove(dst, src, bytes);
    });
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (bytes && !is_pinned_or_device(dst, bytes))
        return set_err(cudaErrorInvalidValue);
    return issue(s, [dst, value, bytes] {
        if (emu_log_on)
            log_push("memset",
                     {{(uint64_t)(uintptr_t)dst, EMU_ARG_PTR},
                      {bytes, EMU_ARG_VALUE},
                      {(uint64_t)value, EMU_ARG_VALUE}},
                     dim3(), 0);
        memset(dst, value, bytes);
    });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    *ev = new emu_event{0};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    delete ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!ev)
        return set_err(cudaErrorInvalidResourceHandle);
    stats.events++;
    return issue(s, [] {});
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!ev)
        return set_err(cudaErrorInvalidResourceHandle);
    if (n_capturing)
        return refuse_in_capture("cudaEventSynchronize");
    return sticky ? set_err(sticky) : cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!s || !is_known_stream(s))
        return set_err(s ? cudaErrorInvalidResourceHandle : cudaErrorStreamCaptureUnsupported);
    if (s->capturing)
        return set_err(cudaErrorIllegalState);
    if (sticky)
        return set_err(sticky);
    s->capturing = 1;
    s->invalidated = 0;
    s->ops.clear();
    n_capturing++;
    stats.captures++;
    if (stats.graphs_freed_running > 0 || frees_unlaunched > 0)
        stats.captures_after_drop++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    std::lock_guard<std::recursive_mutex> l(mu);
    *g = nullptr;
    if (!s || !is_known_stream(s) || !s->capturing)
        return set_err(cudaErrorIllegalState);
    s->capturing = 0;
    n_capturing--;
    capture_ends++;
    if (!s->invalidated && fail_capture_every > 0 && capture_ends % fail_capture_every == 0) {
        s->invalidated = 1; /* as the driver refusing the capture */
        stats.captures_injected++;
    }
    if (s->invalidated) {
        s->ops.clear();
        stats.captures_failed++;
        return set_err(cudaErrorStreamCaptureInvalidated);
    }
    *g = new emu_graph{std::move(s->ops)};
    s->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
    if (!g)
        return set_err(cudaErrorInvalidValue);
    *exec = new emu_graph{g->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> g(mu);
    if (!exec)
        return set_err(cudaErrorInvalidResourceHandle);
    emu_graph *x = exec;
    stats.graph_launches++;
    stats.graphs_freed_running += frees_unlaunched;
    frees_unlaunched = 0;
    return issue(s, [x] {
        replaying = 1;
        for (auto &op : x->ops)
            op();
        replaying = 0;
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (exec) {
        stats.graphs_freed++;
        frees_unlaunched++;
    }
    delete exec;
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (sticky)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new emu_blas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    /* cuda_ctx_close destroys the handle before it frees the pool: what is live now was left
     * to the pool (and the cuBLAS workspace) */
    stats.live_at_close = (long)dev_allocs.size();
    stats.live_bytes_at_close = 0;
    int k = 0;
    for (auto &a : dev_allocs) {
        stats.live_bytes_at_close += a.second.size;
        if (k < 32)
            stats.live_ids_at_close[k++] = a.second.id;
    }
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

static float load_elem(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? md_bf16_to_fp32(h) : __half2float(h);
}

/* C = alpha op(A) op(B) + beta C, column-major: op(A) m x k, op(B) k x n, C m x n, element
 * (i, j) of a matrix with leading dimension ld at i + j * ld. beta == 0 ignores C's old
 * values (NaN included), as cuBLAS does. */
static cublasStatus_t gemm(const char *name, cublasHandle_t h, int ta, int tb, int m, int n, int k,
                           float alpha, const void *A, cudaDataType at, int lda, const void *B,
                           cudaDataType bt, int ldb, float beta, float *C, int ldc) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::recursive_mutex> g(mu);
    cudaError_t err = issue(h->stream, [=] {
        if (emu_log_on) {
            uint64_t bb = 0;
            memcpy(&bb, &beta, sizeof beta);
            log_push(name,
                     {{(uint64_t)(uintptr_t)A, EMU_ARG_PTR},
                      {(uint64_t)at, EMU_ARG_VALUE},
                      {(uint64_t)(uintptr_t)B, EMU_ARG_PTR},
                      {(uint64_t)(uintptr_t)C, EMU_ARG_PTR},
                      {(uint64_t)m, EMU_ARG_VALUE},
                      {(uint64_t)n, EMU_ARG_VALUE},
                      {(uint64_t)k, EMU_ARG_VALUE},
                      {bb, EMU_ARG_VALUE}},
                     dim3(), 0);
        }
        /* op(A) as rows i, op(B) as columns j, each k floats in a row (the same sums, in the
         * same order, as element by element) */
        std::vector<float> a((size_t)m * k), b((size_t)n * k);
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++)
                a[(size_t)i * k + l] = ta ? load_elem(A, at, l + (size_t)i * lda) : load_elem(A, at, i + (size_t)l * lda);
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++)
                b[(size_t)j * k + l] = tb ? load_elem(B, bt, j + (size_t)l * ldb) : load_elem(B, bt, l + (size_t)j * ldb);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float *ar = &a[(size_t)i * k], *br = &b[(size_t)j * k];
                float s = 0;
                for (int l = 0; l < k; l++)
                    s += ar[l] * br[l];
                float *c = &C[i + (size_t)j * ldc];
                *c = alpha * s + (beta == 0 ? 0.0f : beta * *c);
            }
    });
    return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc) {
    return gemm("cublasSgemm", h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb,
                *beta, C, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    if (ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* not what kernels/cuda asks for */
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb,
                *(const float *)beta, (float *)C, ldc);
}

/* ---- emu_log.h ---- */

void emu_log_start(void) {
    std::lock_guard<std::recursive_mutex> g(mu);
    log_recs.clear();
    memset(&stats, 0, sizeof stats);
    fail_capture_every = 0;
    capture_ends = frees_unlaunched = 0;
    next_alloc_id = 1;
    dev_total = EMU_TOTAL_BYTES;
    hook = nullptr;
    emu_log_on = 1;
}

void emu_log_stop(void) {
    emu_log_on = 0;
}

const emu_launch_rec *emu_log(size_t *n) {
    *n = log_recs.size();
    return log_recs.data();
}

void emu_get_stats(emu_stats *out) {
    *out = stats;
}

long emu_live_allocs(size_t *bytes) {
    if (bytes)
        *bytes = dev_used;
    return (long)dev_allocs.size();
}

void emu_log_set_hook(emu_log_hook_fn fn, void *arg) {
    hook = fn;
    hook_arg = arg;
}

void *emu_log_addr(int64_t v, size_t *room) {
    if (v <= 0)
        return nullptr;
    long id = (long)(v >> EMU_PTR_SHIFT);
    size_t off = (size_t)(v & (((int64_t)1 << EMU_PTR_SHIFT) - 1));
    for (auto *m : {&dev_allocs, &host_allocs})
        for (auto &a : *m)
            if (a.second.id == id) {
                *room = a.second.size > off ? a.second.size - off : 0;
                return (void *)(a.first + off);
            }
    return nullptr;
}

void emu_fail_capture_end(int every) {
    fail_capture_every = every;
}

void emu_set_total(size_t bytes) {
    dev_total = bytes ? bytes : EMU_TOTAL_BYTES;
}

int emu_launch_eq(const emu_launch_rec *a, const emu_launch_rec *b) {
    return !strcmp(a->name, b->name) && a->n_args == b->n_args && a->block == b->block &&
           !memcmp(a->grid, b->grid, sizeof a->grid) &&
           !memcmp(a->a, b->a, (size_t)a->n_args * sizeof a->a[0]);
}

void emu_launch_format(const emu_launch_rec *l, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "%s<<<(%u,%u,%u), %u>>>(", l->name, l->grid[0], l->grid[1],
                                l->grid[2], l->block);
    for (int i = 0; i < l->n_args && o < n; i++) {
        int64_t v = l->a[i];
        const char *sep = i ? ", " : "";
        if (v > 0 && v >> EMU_PTR_SHIFT > 0 && v >> EMU_PTR_SHIFT < 1000000)
            o += (size_t)snprintf(buf + o, n - o, "%s#%lld+%lld", sep,
                                  (long long)(v >> EMU_PTR_SHIFT),
                                  (long long)(v & (((int64_t)1 << EMU_PTR_SHIFT) - 1)));
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%lld", sep, (long long)v);
    }
    if (o < n)
        snprintf(buf + o, n - o, ") [step %ld%s]", l->step, l->from_graph ? ", from a graph" : "");
}

}  // extern "C"
