/* pool.c — the CPU backend's thread pool: n-1 worker threads plus the caller.
 *
 * A job is n tasks, fn(ctx, i, n) for i = 0..n-1. Threads claim task indices from one
 * 64-bit word (job generation << 32 | next index) with compare-and-swap, so a task runs
 * exactly once, on whichever thread claims it first; the caller claims too. A worker that
 * the OS has descheduled therefore never holds a job up: the caller runs its task, and
 * only tasks already running are waited for (a decode step is hundreds of small jobs, and
 * this machine class is often oversubscribed).
 *
 * Idle workers spin on the word for a short while (waking a sleeping thread costs more
 * than a small job), yielding now and then, then sleep on a futex. Completion is a count
 * the caller spins on, then futex-waits on. No mutex and no allocation per job. */
#define _GNU_SOURCE
#include "kernels/cpu/cpu_ops.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle thread polls before sleeping, in nanoseconds. */
#define SPIN_NS 200000ull

struct cpu_pool {
    int n;
    pthread_t *threads;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    _Alignas(64) _Atomic uint64_t state; /* generation << 32 | next task index */
    _Alignas(64) atomic_int gen_word;    /* low 32 bits of the generation (futex word) */
    atomic_int sleepers;                 /* workers inside futex_wait on gen_word */
    _Alignas(64) atomic_int done;        /* tasks of the current job finished (futex word) */
    atomic_int caller_waits;             /* the caller sleeps on done */
    atomic_int stop;
};

typedef struct {
    cpu_pool *p;
} worker_arg;

static long futex(atomic_int *addr, int op, int val) {
    return syscall(SYS_futex, (int *)addr, op, val, NULL, NULL, 0);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Claim and run tasks of generation gen until none is left. */
static void run_tasks(cpu_pool *p, uint32_t gen) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen || (int)(uint32_t)s >= p->n)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* Claimed task (uint32)s of job gen: the job cannot end before this task does, so
         * fn and ctx are still the job's. */
        p->fn(p->ctx, (int)(uint32_t)s, p->n);
        /* seq_cst: pairs with the caller's store to caller_waits then load of done */
        if (atomic_fetch_add(&p->done, 1) + 1 == p->n && atomic_load(&p->caller_waits))
            futex(&p->done, FUTEX_WAKE_PRIVATE, 1);
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

static void *worker_main(void *argp) {
    cpu_pool *p = ((worker_arg *)argp)->p;
    free(argp);
    uint32_t seen = 0; /* generation at creation: a job published before we ran is not missed */
    for (;;) {
        uint64_t t0 = 0;
        uint32_t g;
        for (unsigned i = 1;; i++) {
            g = (uint32_t)(atomic_load_explicit(&p->state, memory_order_acquire) >> 32);
            if (g != seen)
                break;
            cpu_relax();
            if ((i & 255) == 0) {
                uint64_t t = now_ns();
                if (t0 == 0)
                    t0 = t;
                else if (t - t0 > SPIN_NS)
                    break;
                sched_yield(); /* let a descheduled thread of ours run */
            }
        }
        if (g == seen) {
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)atomic_load(&p->gen_word) == seen)
                futex(&p->gen_word, FUTEX_WAIT_PRIVATE, (int)seen);
            atomic_fetch_sub(&p->sleepers, 1);
            g = (uint32_t)(atomic_load_explicit(&p->state, memory_order_acquire) >> 32);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        run_tasks(p, g);
    }
}

cpu_pool *cpu_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc > 0 ? (int)nc : 1;
    }
    if (n_threads > 1024)
        n_threads = 1024;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a)
            a->p = p;
        if (!a || pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            p->n = i; /* destroy joins the i-1 threads started so far */
            cpu_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

/* Publish a new generation with task index start (n = nothing to claim). */
static uint32_t publish(cpu_pool *p, uint32_t start) {
    uint32_t g = (uint32_t)(atomic_load(&p->state) >> 32) + 1;
    atomic_store(&p->state, ((uint64_t)g << 32) | start);
    atomic_store(&p->gen_word, (int)g); /* seq_cst: orders with the sleepers load below */
    if (atomic_load(&p->sleepers) > 0)
        futex(&p->gen_word, FUTEX_WAKE_PRIVATE, INT_MAX);
    return g;
}

void cpu_pool_destroy(cpu_pool *p) {
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    publish(p, (uint32_t)p->n);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p ? p->n : 1; }

void cpu_pool_run(cpu_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    run_tasks(p, publish(p, 0));
    if (atomic_load_explicit(&p->done, memory_order_acquire) == p->n)
        return;
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if (atomic_load_explicit(&p->done, memory_order_acquire) == p->n)
            return;
        if ((i & 255) == 0) {
            uint64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
            sched_yield();
        }
    }
    atomic_store(&p->caller_waits, 1);
    int d;
    while ((d = atomic_load(&p->done)) != p->n)
        futex(&p->done, FUTEX_WAIT_PRIVATE, d);
    atomic_store(&p->caller_waits, 0);
}
