/* kvcache.c — block allocator with refcounts, LRU of released blocks, and the prefix index
 * (chained hash table over block ids). */
#include "engine/kvcache.h"

#include <stdlib.h>
#include <string.h>

struct kv_cache {
    int n_blocks, block_tokens;
    int32_t *ref; /* [n_blocks] */
    /* released blocks (refcount 0) in a doubly linked LRU list: head = oldest */
    int32_t *prev, *next;
    int32_t head, tail;
    int n_available;
    /* prefix index */
    uint8_t *indexed;   /* [n_blocks] */
    uint64_t *hash;     /* [n_blocks] */
    uint64_t *parent;   /* [n_blocks] */
    int32_t *tokens;    /* [n_blocks * block_tokens] */
    int32_t *bucket;    /* [n_buckets] first block of the chain, -1 */
    int32_t *chain;     /* [n_blocks] next block in the chain, -1 */
    uint32_t n_buckets; /* power of two */
    int n_indexed;
};

static void lru_push(kv_cache *c, int32_t b) {
    c->prev[b] = c->tail;
    c->next[b] = -1;
    if (c->tail >= 0)
        c->next[c->tail] = b;
    else
        c->head = b;
    c->tail = b;
    c->n_available++;
}

static void lru_remove(kv_cache *c, int32_t b) {
    if (c->prev[b] >= 0)
        c->next[c->prev[b]] = c->next[b];
    else
        c->head = c->next[b];
    if (c->next[b] >= 0)
        c->prev[c->next[b]] = c->prev[b];
    else
        c->tail = c->prev[b];
    c->prev[b] = c->next[b] = -1;
    c->n_available--;
}

int kv_create(int n_blocks, int block_tokens, kv_cache **out, md_err *e) {
    *out = NULL;
    if (n_blocks < 1 || n_blocks > (1 << 26) || block_tokens < 1 || block_tokens > 4096)
        return md_errf(e, MD_EINVAL, "KV cache of %d blocks of %d tokens is not usable", n_blocks,
                       block_tokens);
    kv_cache *c = calloc(1, sizeof *c);
    if (!c)
        return md_errf(e, MD_ENOMEM, "out of memory");
    c->n_blocks = n_blocks;
    c->block_tokens = block_tokens;
    c->n_buckets = 1;
    while (c->n_buckets < (uint32_t)n_blocks * 2)
        c->n_buckets <<= 1;
    size_t nb = (size_t)n_blocks;
    c->ref = calloc(nb, sizeof *c->ref);
    c->prev = malloc(nb * sizeof *c->prev);
    c->next = malloc(nb * sizeof *c->next);
    c->indexed = calloc(nb, 1);
    c->hash = calloc(nb, sizeof *c->hash);
    c->parent = calloc(nb, sizeof *c->parent);
    c->tokens = malloc(nb * block_tokens * sizeof *c->tokens);
    c->bucket = malloc(c->n_buckets * sizeof *c->bucket);
    c->chain = malloc(nb * sizeof *c->chain);
    if (!c->ref || !c->prev || !c->next || !c->indexed || !c->hash || !c->parent || !c->tokens ||
        !c->bucket || !c->chain) {
        kv_free(c);
        return md_errf(e, MD_ENOMEM, "out of memory for a KV cache of %d blocks", n_blocks);
    }
    memset(c->bucket, 0xff, c->n_buckets * sizeof *c->bucket);
    c->head = c->tail = -1;
    for (int32_t b = 0; b < n_blocks; b++) {
        c->chain[b] = -1;
        lru_push(c, b);
    }
    *out = c;
    return 0;
}

void kv_free(kv_cache *c) {
    if (!c)
        return;
    free(c->ref);
    free(c->prev);
    free(c->next);
    free(c->indexed);
    free(c->hash);
    free(c->parent);
    free(c->tokens);
    free(c->bucket);
    free(c->chain);
    free(c);
}

int kv_n_blocks(const kv_cache *c) {
    return c->n_blocks;
}
int kv_block_tokens(const kv_cache *c) {
    return c->block_tokens;
}
int kv_n_available(const kv_cache *c) {
    return c->n_available;
}
int kv_refcount(const kv_cache *c, int32_t b) {
    return c->ref[b];
}
int kv_n_indexed(const kv_cache *c) {
    return c->n_indexed;
}

static void unindex(kv_cache *c, int32_t b) {
    uint32_t k = (uint32_t)c->hash[b] & (c->n_buckets - 1);
    int32_t *p = &c->bucket[k];
    while (*p != b)
        p = &c->chain[*p];
    *p = c->chain[b];
    c->chain[b] = -1;
    c->indexed[b] = 0;
    c->n_indexed--;
}

int32_t kv_alloc(kv_cache *c) {
    int32_t b = c->head;
    if (b < 0)
        return -1;
    lru_remove(c, b);
    if (c->indexed[b])
        unindex(c, b);
    c->ref[b] = 1;
    return b;
}

void kv_ref(kv_cache *c, int32_t b) {
    if (c->ref[b]++ == 0)
        lru_remove(c, b);
}

void kv_unref(kv_cache *c, int32_t b) {
    if (--c->ref[b] == 0)
        lru_push(c, b);
}

uint64_t kv_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h ? h : 1; /* 0 means "no parent" */
}

int32_t kv_lookup(const kv_cache *c, uint64_t parent, const int32_t *tokens) {
    uint64_t h = kv_hash(parent, tokens, c->block_tokens);
    for (int32_t b = c->bucket[(uint32_t)h & (c->n_buckets - 1)]; b >= 0; b = c->chain[b])
        if (c->hash[b] == h && c->parent[b] == parent &&
            !memcmp(c->tokens + (size_t)b * c->block_tokens, tokens,
                    (size_t)c->block_tokens * sizeof *tokens))
            return b;
    return -1;
}

uint64_t kv_publish(kv_cache *c, int32_t b, uint64_t parent, const int32_t *tokens) {
    uint64_t h = kv_hash(parent, tokens, c->block_tokens);
    if (c->indexed[b] || kv_lookup(c, parent, tokens) >= 0)
        return h;
    c->indexed[b] = 1;
    c->hash[b] = h;
    c->parent[b] = parent;
    memcpy(c->tokens + (size_t)b * c->block_tokens, tokens,
           (size_t)c->block_tokens * sizeof *tokens);
    uint32_t k = (uint32_t)h & (c->n_buckets - 1);
    c->chain[b] = c->bucket[k];
    c->bucket[k] = b;
    c->n_indexed++;
    return h;
}

void kv_clear_index(kv_cache *c) {
    for (int32_t b = 0; b < c->n_blocks; b++)
        if (c->indexed[b] && c->ref[b] == 0)
            unindex(c, b);
}
