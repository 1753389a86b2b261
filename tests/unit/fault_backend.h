/* fault_backend.h — a test-only device that injects device failures: it wraps the CPU backend
 * (md_backend_cpu_open), forwards every op to it, and makes one chosen op call fail the way
 * kernels/cuda does (MD_EDEVICE, "CUDA device 0: matmul failed: an illegal memory access was
 * encountered (cudaErrorIllegalAddress)"), or succeed with NaN written into its output (a
 * silent-wrong-answer probe). With sticky=1 every later op of the same backend returns that
 * first error, as kernels/cuda's context keeps its first device error (cuda_internal.h
 * `failed`); without it the failure is transient and the next op works.
 *
 * Device names, registered under the prefix "faulty" (fault_backend_register):
 *   faulty:op=OP[,after=N][,step=S][,sticky=0|1][,kind=error|nan|oom|hang][,record=0|1]
 *          [,fused=0|1][,shadow=0|1][,seqs=N][,steptokens=N][,threads=K]
 *     OP      a backend op: buf_alloc, buf_wrap, buf_upload, buf_download, buf_zero, reserve,
 *             batch_prepare, embed, matmul, add_bias, rmsnorm, rope, kv_write, attention,
 *             swiglu, add, gather_rows, sync, argmax, step_begin, step_end (with record=1),
 *             matmul_n, rope_kv (with fused=1), weight_shadow (with shadow=1);
 *             or "none" (a plain pass-through)
 *     after   the N-th call of OP fails (1-based, default 1), counted from open, or from the
 *             start of step S when step is given
 *     step    S >= 1: count only the calls of OP made during the S-th forward pass (the S-th
 *             batch_prepare since open and the ops up to the next one); not with
 *             op=batch_prepare, whose calls are the steps (use after=S)
 *     sticky  1: the failure is permanent for this backend (every later op fails with it)
 *     kind    error (default): MD_EDEVICE; oom: MD_ENOMEM "out of memory
 *             (cudaErrorMemoryAllocation)"; hang: the op blocks (a kernel that never
 *             finishes) until fault_backend_release() is called, then fails with MD_EDEVICE
 *             "the launch timed out and was terminated (cudaErrorLaunchTimeout)", as a
 *             kernel the driver's watchdog killed; nan: the op succeeds and its output is all NaN
 *             (ops with a float output: embed, matmul, add_bias, rmsnorm, rope, attention,
 *             swiglu, add, gather_rows, matmul_n: its first output, rope_kv: q)
 *     record  1: the backend has step_begin / step_end (as kernels/cuda for CUDA graphs), which
 *             run nothing themselves: the ops still run directly, so the engine's bracketing
 *             and its error path are what is exercised (default 0: none, as the CPU backend)
 *     fused   1: the backend has matmul_n and rope_kv (as kernels/cpu and kernels/cuda), so
 *             the engine runs Q/K/V, gate/up+SwiGLU, the residual products and RoPE + KV
 *             stores through them (default 0: the unfused matmul / add / swiglu / rope /
 *             kv_write sequence)
 *     shadow  1: the backend has weight_shadow, which counts the copies asked for (stats) and
 *             changes nothing else: the engine's policy and its out-of-memory path are what
 *             is exercised
 *     seqs, steptokens  the backend's default_max_seqs / default_step_tokens (as
 *             kernels/cuda sets them; default: the CPU backend's, none)
 *     threads CPU threads of the wrapped backend (default: the n_threads given to open)
 * A bad spec is refused at open with MD_EINVAL naming the part it could not read.
 *
 * Ownership: the wrapped CPU backend belongs to the fault backend and is freed with it;
 * buffers are the CPU backend's own (handed through unchanged). fault_backend_stats reads the
 * counters of the most recently opened fault backend (tests open one engine at a time). */
#ifndef MEDLEY_TESTS_FAULT_BACKEND_H
#define MEDLEY_TESTS_FAULT_BACKEND_H

#include "kernels/backend.h"

/* md_backend_register("faulty", ...). Returns 0 or the registration's error. */
int fault_backend_register(md_err *e);

/* Open a fault backend from a "faulty:..." device name (the md_backend_open_fn). */
int fault_backend_open(const char *device, int n_threads, md_backend **out, md_err *e);

typedef struct {
    int opened;     /* fault backends opened since the process started */
    int freed;      /* and freed */
    long steps;     /* batch_prepare calls of the last one opened */
    long injected;  /* faults injected (the failing call itself, or NaN outputs) */
    long refused;   /* ops refused afterwards because of a sticky failure */
    long live_bufs; /* buffers allocated or wrapped and not yet freed */
    long shadows;      /* weight_shadow calls that succeeded (shadow=1) */
    long shadow_bytes; /* the BF16 bytes those copies of quantized weights would take */
    long hanging;      /* ops blocked by kind=hang right now */
} fault_backend_stats;

void fault_backend_get_stats(fault_backend_stats *st);

/* Let every op blocked by kind=hang (now or later in this process) return its error. */
void fault_backend_release(void);

#endif
