/* fake_cuda.h — a host-only stand-in for kernels/cuda's device layer: every cuda_ops.h function
 * backend_cuda.c calls, and the CUDA runtime calls it makes (cudaMallocHost, events, errors),
 * so the real backend_cuda.c (with step_plan.c and graph_cache.c) runs under the real engine
 * on a machine without a GPU or driver (tests/unit/test_cuda_host.c).
 *
 * Device memory is host memory (calloc). The stream is a list of launch records: each launcher
 * appends {function, every scalar argument, every pointer normalised to (allocation id,
 * offset)} when it runs; between cuda_graph_begin and cuda_graph_end records go into the graph
 * instead, and cuda_graph_launch appends the graph's records (that is when a replayed kernel
 * "runs", with the arguments frozen at capture). Copies really copy (an upload's record holds a
 * hash of the bytes unless they come from pinned staging, whose unused parts may hold anything);
 * compute launchers compute nothing, except cuda_argmax and cuda_sample, which write a
 * deterministic token id per row (a hash of the step number and the row) so the engine moves
 * on. Allocation ids count successful allocations from fake_cuda_reset, so two runs of the same
 * work give equal records when, and only when, their launches are equal.
 *
 * As ctx.cu does, cuda_pool_alloc refuses while capturing (so scratch growth inside a capture
 * fails the capture) and GEMM scratch grows on demand (cuda_ctx_scratch_gen counts the moves).
 * When a record reaches the stream the fake also checks what the kernel would touch: every
 * pointer inside a live allocation with room for the access, the KV slots and block ids it
 * would follow (read from "device" memory at that moment) inside the caches, and that pinned
 * host memory an upload reads was not rewritten before the copy was known complete. A failed
 * check is a violation (counted, first one kept); the launch itself goes on.
 *
 * Not thread-safe: one engine thread. Ownership: the stream and graphs are the fake's; the
 * pointer from fake_cuda_stream is valid until the next fake_cuda_reset. */
#ifndef MEDLEY_TESTS_FAKE_CUDA_H
#define MEDLEY_TESTS_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define FAKE_CUDA_MAX_ARGS 16

typedef struct {
    int fn;                        /* which launcher (fake_cuda_fn_name) */
    int n_args;                    /* used entries of a */
    int64_t a[FAKE_CUDA_MAX_ARGS]; /* scalars as integers (floats by their bits), pointers as
                                      (allocation id << 40 | offset), 0 for NULL */
    uint64_t reads; /* hash of the step metadata the kernel follows when it runs: token ids,
                       positions, slots, logit rows, decode entries and tiles with the
                       block-table entries they name (0 for other kernels) */
    /* where it came from, not part of the comparison */
    int from_graph; /* appended by cuda_graph_launch */
    long step;      /* cudaEventRecord calls before it (backend_cuda.c: one per batch_prepare) */
} fake_launch;

typedef struct {
    long captures, captures_failed, captures_aborted; /* cuda_graph_begin / failed ends / aborts */
    long captures_injected;    /* failures made by fake_cuda_fail_capture_end */
    long graph_launches;       /* cuda_graph_launch calls */
    long graphs_freed;         /* cuda_graph_free calls */
    long graphs_freed_running; /* ... followed later by another graph launch (dropped, evicted) */
    long captures_after_drop;  /* captures begun after the first such free */
    long allocs_refused;       /* cuda_pool_alloc refused while capturing */
    long scratch_moves;        /* GEMM scratch growths + cuda_ctx_scratch_moved */
    long violations;
    char first_violation[512];
    /* allocations (and their bytes) still live when cuda_ctx_close freed the pool: what the
     * backend and its user left to the pool rather than freeing */
    long live_at_close;
    size_t live_bytes_at_close;
    int64_t live_ids_at_close[32]; /* their allocation ids (the first 32) */
} fake_cuda_stats;

/* Forget the stream, the statistics and the options; allocation ids restart at 1. */
void fake_cuda_reset(void);
/* Make every `every`-th cuda_graph_end answer CUDA_ECAPTURE, as a capture the driver refused
 * (0 = never). */
void fake_cuda_fail_capture_end(int every);
/* Make the device hold `bytes` in all (0: 80 GiB), so allocations past it fail as cudaMalloc's
 * would. */
void fake_cuda_set_total(size_t bytes);
/* Live allocations now, and their bytes (bytes may be NULL). */
long fake_cuda_live(size_t *bytes);
const fake_launch *fake_cuda_stream(size_t *n);
void fake_cuda_get_stats(fake_cuda_stats *out);
/* Same function, arguments and metadata read (origin and step not compared). */
int fake_cuda_launch_eq(const fake_launch *a, const fake_launch *b);
const char *fake_cuda_fn_name(int fn);
/* "cuda_attn_decode(k=#12+0, ..., n_splits=2, ...)" */
void fake_cuda_format(const fake_launch *l, char *buf, size_t n);
/* Value of argument `name` of l; 0 when it has no such argument. */
int64_t fake_cuda_arg(const fake_launch *l, const char *name);

#endif
