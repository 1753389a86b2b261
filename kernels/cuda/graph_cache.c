/* graph_cache.c — the decode-step graph cache's policy (see graph_cache.h). */
#include "kernels/cuda/graph_cache.h"

#include <limits.h>
#include <string.h>

static int key_eq(const cuda_gc_key *a, const cuda_gc_key *b) {
    return !memcmp(a->k, b->k, sizeof a->k);
}

void cuda_gc_init(cuda_graph_cache *gc, void (*free_graph)(void *graph)) {
    memset(gc, 0, sizeof *gc);
    gc->free_graph = free_graph;
}

void cuda_gc_clear(cuda_graph_cache *gc) {
    for (int i = 0; i < CUDA_GC_SLOTS; i++)
        if (gc->slot[i].graph) {
            if (gc->free_graph)
                gc->free_graph(gc->slot[i].graph);
            gc->slot[i].graph = NULL;
            gc->dropped++;
        }
    /* the keys stay "seen": their next step records again at once */
}

void cuda_gc_sync_gen(cuda_graph_cache *gc, unsigned gen) {
    if (gen != gc->gen) {
        cuda_gc_clear(gc);
        gc->gen = gen;
    }
}

static int seen_index(cuda_graph_cache *gc, const cuda_gc_key *key) {
    for (int i = 0; i < gc->n_seen; i++)
        if (key_eq(&gc->seen[i].key, key))
            return i;
    return -1;
}

cuda_gc_action cuda_gc_lookup(cuda_graph_cache *gc, const cuda_gc_key *key, void **graph) {
    *graph = NULL;
    gc->tick++;
    for (int i = 0; i < CUDA_GC_SLOTS; i++)
        if (gc->slot[i].graph && key_eq(&gc->slot[i].key, key)) {
            gc->slot[i].last_use = gc->tick;
            *graph = gc->slot[i].graph;
            gc->replayed++;
            return CUDA_GC_REPLAY;
        }
    int s = seen_index(gc, key);
    if (s < 0) {
        if (gc->n_seen < CUDA_GC_SEEN) {
            s = gc->n_seen++;
        } else {
            s = gc->next_seen;
            gc->next_seen = (gc->next_seen + 1) % CUDA_GC_SEEN;
        }
        gc->seen[s].key = *key;
        gc->seen[s].seen = 0;
        gc->seen[s].failed = 0;
    }
    if (gc->seen[s].failed >= 2)
        return CUDA_GC_EAGER;
    return ++gc->seen[s].seen >= 2 ? CUDA_GC_RECORD : CUDA_GC_EAGER;
}

void cuda_gc_store(cuda_graph_cache *gc, const cuda_gc_key *key, void *graph) {
    int victim = 0;
    for (int i = 0; i < CUDA_GC_SLOTS; i++) {
        if (!gc->slot[i].graph) {
            victim = i;
            break;
        }
        if (gc->slot[i].last_use < gc->slot[victim].last_use)
            victim = i;
    }
    if (gc->slot[victim].graph) {
        if (gc->free_graph)
            gc->free_graph(gc->slot[victim].graph);
        gc->evicted++;
    }
    gc->slot[victim].key = *key;
    gc->slot[victim].graph = graph;
    gc->slot[victim].last_use = ++gc->tick;
    gc->recorded++;
}

void cuda_gc_failed(cuda_graph_cache *gc, const cuda_gc_key *key) {
    int s = seen_index(gc, key);
    if (s >= 0) {
        gc->seen[s].failed++;
        gc->seen[s].seen = 1;
    }
}

int cuda_gc_pad_rows(int n, int cap) {
    if (n <= 1)
        return n;
    int p;
    if (n <= 8) {
        p = 2;
        while (p < n)
            p <<= 1;
    } else {
        int q = n <= 64 ? 8 : n <= 128 ? 16 : n <= 256 ? 32 : 64;
        p = n > INT_MAX - q ? n : (n + q - 1) / q * q;
    }
    if (p > cap)
        p = cap;
    return p < n ? n : p;
}

int cuda_gc_len_bucket(int max_len) {
    int b = 64;
    while (b < max_len && b < (1 << 30))
        b <<= 1;
    return b;
}
