/* graph_cache.h — which decode steps the CUDA backend records as graphs, and the graphs it
 * keeps. Pure C, no CUDA calls (the graphs are opaque pointers freed through a callback), so
 * the policy is tested on machines without a GPU.
 *
 * A step's key is every host-side value its kernel launches depend on (its rows, padded by
 * cuda_gc_pad_rows, and the attention split bucket); pointers are fixed by reserve() and by the
 * scratch generation: when any scratch buffer a recorded kernel reads moves, every graph is
 * dropped (cuda_gc_sync_gen). A key is recorded the second time it is seen (a shape seen
 * once is not worth a capture); a key whose capture failed twice is never tried again. The
 * cache holds CUDA_GC_SLOTS graphs and evicts the least recently used.
 *
 * Ownership: the cache owns the graphs it holds and frees them with free_graph. */
#ifndef MEDLEY_KERNELS_CUDA_GRAPH_CACHE_H
#define MEDLEY_KERNELS_CUDA_GRAPH_CACHE_H

#include <stdint.h>

#define CUDA_GC_SLOTS 32
#define CUDA_GC_KEY 4
#define CUDA_GC_SEEN 128 /* keys remembered for the "seen before" count */

typedef struct {
    int32_t k[CUDA_GC_KEY];
} cuda_gc_key;

typedef enum { CUDA_GC_EAGER = 0, CUDA_GC_RECORD, CUDA_GC_REPLAY } cuda_gc_action;

typedef struct {
    struct {
        cuda_gc_key key;
        void *graph;
        uint64_t last_use;
    } slot[CUDA_GC_SLOTS];
    struct {
        cuda_gc_key key;
        int seen, failed;
    } seen[CUDA_GC_SEEN];
    int n_seen, next_seen; /* ring once full */
    uint64_t tick;
    unsigned gen;
    void (*free_graph)(void *graph);
    long recorded, replayed, evicted, dropped; /* counters for logs and tests */
} cuda_graph_cache;

void cuda_gc_init(cuda_graph_cache *gc, void (*free_graph)(void *graph));
/* Free every graph. */
void cuda_gc_clear(cuda_graph_cache *gc);
/* Drop every graph when the scratch generation moved since they were recorded. */
void cuda_gc_sync_gen(cuda_graph_cache *gc, unsigned gen);
/* What to do with a step of this key: replay *graph, record it, or run it directly. */
cuda_gc_action cuda_gc_lookup(cuda_graph_cache *gc, const cuda_gc_key *key, void **graph);
/* Keep a graph recorded for key (evicting the least recently used when full). */
void cuda_gc_store(cuda_graph_cache *gc, const cuda_gc_key *key, void *graph);
/* A capture of key failed: it is seen as new again; after two failures never recorded. */
void cuda_gc_failed(cuda_graph_cache *gc, const cuda_gc_key *key);

/* The rows a decode step of n sequences runs as, so that steps of nearby sizes share one
 * graph (the backend pads the step with rows that store nothing and whose outputs nobody
 * reads): n up to 8 rounded up to a power of two, then up to a multiple of 8 (to 64), of 16
 * (to 128), of 32 (to 256), of 64 beyond; at most cap, never below n. 19 sizes up to 256. */
int cuda_gc_pad_rows(int n, int cap);

/* The attention split bucket of a decode step: the longest KV length rounded up to a power
 * of two (at least 64), so a growing sequence changes key only at 64, 128, 256, ... */
int cuda_gc_len_bucket(int max_len);

#endif
