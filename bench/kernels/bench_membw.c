/* bench_membw.c — this machine's memory read bandwidth: the ceiling of single-sequence decode,
 * which reads every weight once per token.
 *
 *   build/bench_membw [threads] [MiB ...] [reps]      # default 2 threads, 16 64 256 1024 MiB
 *
 * Each size is one buffer, written once (so its pages exist), then read by `threads` threads,
 * each summing its contiguous slice with 64-byte (AVX-512), 32-byte (AVX2) or 8-byte loads and
 * several independent accumulators; the threads start together at a barrier. GB/s (10^9 bytes
 * per second of wall time) is the best of reps passes (default 5); "GB/s cpu" is each thread's
 * bytes over its own CPU time, summed over the threads (on a loaded machine a descheduled thread
 * stretches the wall time but not its CPU time: what a process gets while it runs; the two
 * agree on a quiet machine, as long as the threads overlap). A size under the last-level
 * cache measures the cache, not DRAM: on a machine whose L3 holds the model's weights, decode's
 * ceiling is the cache figure at the weights' size. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sum of n 64-bit words (n a multiple of 32), by the widest loads the CPU has. */
static uint64_t sum_scalar(const uint64_t *p, size_t n) {
    uint64_t a[8] = {0};
    for (size_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, a0);
    return t[0] + t[1] + t[2] + t[3];
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
    }
    return (uint64_t)_mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}
#endif

typedef uint64_t (*sum_fn)(const uint64_t *, size_t);

typedef struct {
    const uint64_t *p;
    size_t n; /* words of this thread's slice */
    sum_fn fn;
    pthread_barrier_t *start;
    uint64_t out;
    double cpu; /* seconds of this thread's CPU time in the sum */
} slice;

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    slice *s = arg;
    pthread_barrier_wait(s->start);
    double c0 = thread_cpu_s();
    s->out = s->fn(s->p, s->n);
    s->cpu = thread_cpu_s() - c0;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "bench_membw: threads must be 1..256, got %s\n", argv[1]);
        return 2;
    }
    size_t mib[16] = {16, 64, 256, 1024};
    int n_sizes = 4, reps = 5;
    if (argc > 2) {
        n_sizes = 0;
        for (int i = 2; i < argc && n_sizes < 16; i++) {
            long v = atol(argv[i]);
            if (v < 1 || v > (1 << 20)) {
                fprintf(stderr, "bench_membw: size %s MiB out of range 1..1048576\n", argv[i]);
                return 2;
            }
            mib[n_sizes++] = (size_t)v;
        }
    }
    sum_fn fn = sum_scalar;
    const char *level = "scalar";
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        fn = sum_avx512, level = "avx512";
    else if (__builtin_cpu_supports("avx2"))
        fn = sum_avx2, level = "avx2";
#endif
    printf("threads %d, %s loads, best of %d\n%10s %10s %10s %10s\n", threads, level, reps, "MiB",
           "GB/s", "ms/pass", "GB/s cpu");
    for (int si = 0; si < n_sizes; si++) {
        size_t bytes = mib[si] << 20, words = bytes / 8;
        uint64_t *buf = NULL;
        if (posix_memalign((void **)&buf, 64, bytes)) {
            fprintf(stderr, "bench_membw: cannot allocate %zu MiB\n", mib[si]);
            return 1;
        }
        for (size_t i = 0; i < words; i++)
            buf[i] = i;
        size_t per = words / (size_t)threads / 32 * 32;
        double best = 1e30, best_cpu = 0;
        uint64_t check = 0;
        for (int r = 0; r < reps; r++) {
            pthread_barrier_t start;
            pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
            slice sl[256];
            pthread_t th[256];
            for (int t = 0; t < threads; t++) {
                sl[t] = (slice){buf + (size_t)t * per, per, fn, &start, 0, 0};
                if (pthread_create(&th[t], NULL, reader, &sl[t])) {
                    fprintf(stderr, "bench_membw: cannot start thread %d\n", t);
                    return 1;
                }
            }
            double t0 = now_s();
            pthread_barrier_wait(&start);
            for (int t = 0; t < threads; t++) {
                pthread_join(th[t], NULL);
                check += sl[t].out;
            }
            double dt = now_s() - t0, by_cpu = 0;
            for (int t = 0; t < threads; t++)
                by_cpu += sl[t].cpu > 0 ? (double)per * 8 / sl[t].cpu : 0;
            if (by_cpu > best_cpu)
                best_cpu = by_cpu;
            pthread_barrier_destroy(&start);
            if (dt < best)
                best = dt;
        }
        double read = (double)per * 8 * threads;
        printf("%10zu %10.1f %10.3f %10.1f\n", mib[si], read / best / 1e9, best * 1e3,
               best_cpu / 1e9);
        fprintf(stderr, "checksum %llu\n", (unsigned long long)check); /* keeps the sums live */
        free(buf);
    }
    return 0;
}
