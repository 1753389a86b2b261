/* kvcache.h — the paged KV cache's block accounting (docs/design.md §5): fixed-size blocks under
 * a memory budget, reference counts so sequences with the same prompt prefix share blocks,
 * and a prefix index from "this block's tokens after that prefix" to a block already
 * computed. The K/V data itself lives in backend buffers (md_kv_bufs); this module only
 * decides which block holds what.
 *
 * A block is free (refcount 0, not indexed), cached (refcount 0 but indexed: its contents
 * are a known prefix and can be shared again until evicted) or in use (refcount > 0).
 * kv_alloc() takes a free block first, else evicts the least recently released cached one.
 *
 * Indexing is exact: kv_lookup() checks the parent hash and the block's tokens, not only a
 * 64-bit hash, so a hash collision cannot hand a sequence someone else's K/V.
 *
 * Ownership: kv_cache owns its arrays; kv_create/kv_free. Not thread-safe (the engine's
 * single caller thread uses it). */
#ifndef MEDLEY_ENGINE_KVCACHE_H
#define MEDLEY_ENGINE_KVCACHE_H

#include <stdint.h>

#include "common/err.h"

typedef struct kv_cache kv_cache;

int kv_create(int n_blocks, int block_tokens, kv_cache **out, md_err *e);
void kv_free(kv_cache *c);

int kv_n_blocks(const kv_cache *c);
int kv_block_tokens(const kv_cache *c);
/* Blocks kv_alloc() can still hand out (free + cached). */
int kv_n_available(const kv_cache *c);
int kv_refcount(const kv_cache *c, int32_t block);

/* A block with refcount 1, or -1 when every block is in use. */
int32_t kv_alloc(kv_cache *c);
/* Take another reference (sharing). A cached block becomes in use again. */
void kv_ref(kv_cache *c, int32_t block);
/* Drop a reference; at 0 an indexed block becomes cached, others free. */
void kv_unref(kv_cache *c, int32_t block);

/* Hash of a full block of tokens following the prefix whose last block hashed to parent
 * (0 for the first block). */
uint64_t kv_hash(uint64_t parent, const int32_t *tokens, int n);
/* Index block (full, its K/V written or being written in the current step) as holding
 * tokens after parent; returns its hash. An equal entry already indexed is left as is. */
uint64_t kv_publish(kv_cache *c, int32_t block, uint64_t parent, const int32_t *tokens);
/* The indexed block holding tokens after parent, or -1. Does not take a reference. */
int32_t kv_lookup(const kv_cache *c, uint64_t parent, const int32_t *tokens);
/* Forget every indexed block not in use (after a failed step wrote nothing trustworthy). */
void kv_clear_index(kv_cache *c);
/* Number of indexed blocks (tests). */
int kv_n_indexed(const kv_cache *c);

#endif
