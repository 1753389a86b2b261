/* pool.c — the CPU backend's thread pool: n-1 worker threads plus the caller.
 *
 * A job is published by bumping a generation counter; workers spin on it for a short
 * while after each job (a decode step issues hundreds of small jobs, so waking a sleeping
 * thread each time would cost more than the work), then sleep on a futex. Completion is a
 * countdown the caller spins on, then futex-waits on. No mutex and no allocation per job. */
#define _GNU_SOURCE
#include "kernels/cpu/cpu_ops.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
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
    _Alignas(64) atomic_int gen;      /* bumped once per job (futex word) */
    _Alignas(64) atomic_int pending;  /* workers still running the current job (futex word) */
    atomic_int sleepers;              /* workers inside futex_wait on gen */
    atomic_int caller_waits;          /* the caller sleeps on pending */
    atomic_int stop;
};

typedef struct {
    cpu_pool *p;
    int ith;
} worker_arg;

static long futex(atomic_int *addr, int op, int val) {
    return syscall(SYS_futex, (int *)addr, op, val, NULL, NULL, 0);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wait until *word != seen: spin for SPIN_NS, then sleep. `sleepers` counts sleepers so
 * the writer knows whether to issue a wake syscall. */
static void wait_change(atomic_int *word, int seen, atomic_int *sleepers) {
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != seen)
            return;
        cpu_relax();
        if ((i & 255) == 0) {
            uint64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
        }
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(word) == seen)
        futex(word, FUTEX_WAIT_PRIVATE, seen);
    atomic_fetch_sub(sleepers, 1);
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    cpu_pool *p = a->p;
    int ith = a->ith;
    free(a);
    int seen = 0; /* gen at creation: a job published before this thread ran is not missed */
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers);
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load(&p->stop))
            return NULL;
        p->fn(p->ctx, ith, p->n);
        /* seq_cst pairs with the caller's store to caller_waits then load of pending */
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_waits))
            futex(&p->pending, FUTEX_WAKE_PRIVATE, 1);
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
        if (a) {
            a->p = p;
            a->ith = i;
        }
        if (!a || pthread_create(&p->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            p->n = i; /* destroy joins the i-1 threads started so far */
            cpu_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void cpu_pool_destroy(cpu_pool *p) {
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
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
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: orders with the sleepers load below */
    if (atomic_load(&p->sleepers) > 0)
        futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
    fn(ctx, 0, p->n);
    int left = atomic_load_explicit(&p->pending, memory_order_acquire);
    if (left == 0)
        return;
    uint64_t t0 = 0;
    for (unsigned i = 1; left != 0; i++) {
        cpu_relax();
        left = atomic_load_explicit(&p->pending, memory_order_acquire);
        if ((i & 255) == 0) {
            uint64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
        }
    }
    if (left == 0)
        return;
    atomic_store(&p->caller_waits, 1);
    while ((left = atomic_load(&p->pending)) != 0)
        futex(&p->pending, FUTEX_WAIT_PRIVATE, left);
    atomic_store(&p->caller_waits, 0);
}
