/* emu_log.h — what the emulated device (emu_rt.cc) executed, for tests of the CUDA backend's
 * host logic on the real kernels/cuda code (tests/gpu/emu/test_cuda_host_emu.c).
 *
 * Between emu_log_start and emu_log_stop every kernel launch, cuBLAS GEMM, host-to-device
 * copy and memset is appended to a log when it runs on the device: at once on a stream that
 * is not capturing, at cudaGraphLaunch for one recorded into a graph (with the arguments it
 * was captured with). A record holds the kernel's name (template arguments dropped), its
 * configuration and its arguments in order: scalars by their bits (floats too), pointers as
 * (allocation id << EMU_PTR_SHIFT | offset), ids counting cudaMalloc and cudaMallocHost calls
 * from emu_log_start, so two runs of the same work log equal records when, and only when,
 * they launch the same. A pointer argument outside every live allocation is a bad pointer
 * (counted, the first described); with MEDLEY_CUDA_POOL_EXACT=1 every pool buffer is its own
 * allocation, so a pointer to a freed buffer is one. A struct argument (gemv_segs) is logged
 * as its 8-byte words, each normalised when it points into an allocation.
 * GEMMs: cublasGemmEx / cublasSgemm (A, A's type, B, C, m, n, k, beta) as cuBLAS takes them.
 * Copies: memcpyHtoD (dst, bytes, hash of the bytes or 0 from pinned memory), memset (dst,
 * bytes, value).
 *
 * Not thread-safe against a running engine: read the log between steps. The pointer from
 * emu_log is valid until the next launch or emu_log_start. */
#ifndef MEDLEY_TESTS_EMU_LOG_H
#define MEDLEY_TESTS_EMU_LOG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMU_LOG_MAX_ARGS 24
#define EMU_PTR_SHIFT 40

typedef struct {
    char name[40];
    unsigned grid[3], block; /* 0 for GEMMs and copies */
    int n_args;
    int64_t a[EMU_LOG_MAX_ARGS];
    /* where it came from, not compared by emu_launch_eq */
    int from_graph; /* run by cudaGraphLaunch */
    long step;      /* cudaEventRecord calls before it (backend_cuda.c: one per batch_prepare) */
} emu_launch_rec;

typedef struct {
    long events;               /* cudaEventRecord calls */
    long captures;             /* cudaStreamBeginCapture */
    long captures_failed;      /* cudaStreamEndCapture refusals (invalidated or injected) */
    long captures_injected;    /* ... made by emu_fail_capture_end */
    long graph_launches;       /* cudaGraphLaunch */
    long graphs_freed;         /* cudaGraphExecDestroy */
    long graphs_freed_running; /* ... followed later by another graph launch (dropped) */
    long captures_after_drop;  /* captures begun after the first such destroy */
    long bad_pointers;         /* launch arguments outside every live allocation */
    char first_bad[256];
    /* device allocations live when cuda_ctx_close destroyed the cuBLAS handle (just before
     * it frees the pool): the workspace and what the backend left to the pool */
    long live_at_close;
    size_t live_bytes_at_close;
    long live_ids_at_close[32]; /* their allocation ids (the first 32, by address) */
} emu_stats;

/* Empty the log and the counters, restart allocation ids at 1, clear the options below, and
 * record until emu_log_stop. */
void emu_log_start(void);
void emu_log_stop(void);
const emu_launch_rec *emu_log(size_t *n);
void emu_get_stats(emu_stats *out);
/* Live device allocations now, and their bytes (bytes may be NULL). */
long emu_live_allocs(size_t *bytes);
/* Make every `every`-th cudaStreamEndCapture fail as a capture the driver invalidated
 * (0: never). */
void emu_fail_capture_end(int every);
/* Make the device hold `bytes` in all (0: the default, 6 GiB). */
void emu_set_total(size_t bytes);
/* Called with each record as it is logged, while the device memory its pointers name holds
 * what the launch reads (NULL: none). */
typedef void (*emu_log_hook_fn)(const emu_launch_rec *r, void *arg);
void emu_log_set_hook(emu_log_hook_fn fn, void *arg);
/* The address behind a logged pointer (NULL when its allocation is not live), and the bytes
 * from there to the allocation's end. */
void *emu_log_addr(int64_t v, size_t *room);
/* Same name, configuration and arguments (origin and step not compared). */
int emu_launch_eq(const emu_launch_rec *a, const emu_launch_rec *b);
/* "k_attn_dec<<<(4,1,2), 128>>>(#12+0, ...) [step 3, from a graph]" */
void emu_launch_format(const emu_launch_rec *l, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
