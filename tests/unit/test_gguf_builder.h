/* test_gguf_builder.h — writes small GGUF files in memory for the GGUF tests and the fuzzer.
 *
 * gb_* append little-endian fields to a growable buffer; the caller owns gb.buf (free it).
 * gb_small_model() builds a valid v3 file exercising every metadata value type, a nested
 * array, a string array and one tensor per supported element type, and records where each
 * field starts (gb_marks) so mutators can lie about a specific count, length or offset. */
#ifndef MEDLEY_TESTS_GGUF_BUILDER_H
#define MEDLEY_TESTS_GGUF_BUILDER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "engine/weights/gguf.h"

typedef struct {
    uint8_t *buf;
    size_t len, cap;
} gb;

static inline void gb_put(gb *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *nb = realloc(b->buf, cap);
        if (!nb)
            abort();
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
}
static inline void gb_u8(gb *b, uint8_t v) {
    gb_put(b, &v, 1);
}
static inline void gb_u32(gb *b, uint32_t v) {
    gb_put(b, &v, 4);
}
static inline void gb_u64(gb *b, uint64_t v) {
    gb_put(b, &v, 8);
}
static inline void gb_f32(gb *b, float v) {
    gb_put(b, &v, 4);
}
static inline void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static inline void gb_pad(gb *b, size_t align) {
    while (b->len % align)
        gb_u8(b, 0);
}

/* Offsets of interesting fields in the file gb_small_model() writes. */
typedef struct {
    size_t n_tensors, n_kv; /* header counts */
    size_t kv[32];          /* start of each key/value (the key's length) */
    size_t kv_type[32];     /* each value's type field */
    int nkv;
    size_t tensor[16]; /* start of each tensor entry (its name length) */
    size_t tensor_ndims[16], tensor_dims[16], tensor_type[16], tensor_off[16];
    int nt;
    size_t data; /* start of the data section */
} gb_marks;

#define GB_ALIGN 32

static inline void gb_key(gb *b, gb_marks *m, const char *key, uint32_t type) {
    m->kv[m->nkv] = b->len;
    gb_str(b, key);
    m->kv_type[m->nkv++] = b->len;
    gb_u32(b, type);
}

/* Tensors of the small model: name, type, dims (ne0, ne1). */
static const struct {
    const char *name;
    int type;
    int64_t ne0, ne1;
} gb_tensors[] = {
    {"t.f32", MD_TYPE_F32, 8, 2},     {"t.f16", MD_TYPE_F16, 16, 1},
    {"t.bf16", MD_TYPE_BF16, 4, 4},   {"t.q8_0", MD_TYPE_Q8_0, 64, 1},
    {"t.q4_0", MD_TYPE_Q4_0, 32, 2},  {"t.q4_1", MD_TYPE_Q4_1, 32, 1},
    {"t.q4_k", MD_TYPE_Q4_K, 256, 1}, {"t.q6_k", MD_TYPE_Q6_K, 256, 1},
};
#define GB_NT ((int)(sizeof gb_tensors / sizeof gb_tensors[0]))

/* A valid GGUF v3 file; tensor data is a deterministic byte pattern (fp16 fields stay
 * finite because every byte is < 0x78). */
static inline gb gb_small_model(gb_marks *m) {
    gb b = {0};
    memset(m, 0, sizeof *m);
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, 3);
    m->n_tensors = b.len;
    gb_u64(&b, GB_NT);
    m->n_kv = b.len;
    gb_u64(&b, 19);
    gb_key(&b, m, "general.architecture", GGUF_T_STRING);
    gb_str(&b, "llama");
    gb_key(&b, m, "general.alignment", GGUF_T_UINT32);
    gb_u32(&b, GB_ALIGN);
    gb_key(&b, m, "t.u8", GGUF_T_UINT8);
    gb_u8(&b, 200);
    gb_key(&b, m, "t.i8", GGUF_T_INT8);
    gb_u8(&b, 0xfe); /* -2 */
    gb_key(&b, m, "t.u16", GGUF_T_UINT16);
    gb_put(&b, &(uint16_t){65000}, 2);
    gb_key(&b, m, "t.i16", GGUF_T_INT16);
    gb_put(&b, &(int16_t){-300}, 2);
    gb_key(&b, m, "llama.context_length", GGUF_T_UINT32);
    gb_u32(&b, 2048);
    gb_key(&b, m, "t.i32", GGUF_T_INT32);
    gb_put(&b, &(int32_t){-70000}, 4);
    gb_key(&b, m, "llama.rope.freq_base", GGUF_T_FLOAT32);
    gb_f32(&b, 10000.0f);
    gb_key(&b, m, "t.bool", GGUF_T_BOOL);
    gb_u8(&b, 1);
    gb_key(&b, m, "t.u64", GGUF_T_UINT64);
    gb_u64(&b, UINT64_MAX);
    gb_key(&b, m, "t.i64", GGUF_T_INT64);
    gb_put(&b, &(int64_t){-5000000000LL}, 8);
    gb_key(&b, m, "t.f64", GGUF_T_FLOAT64);
    gb_put(&b, &(double){0.25}, 8);
    gb_key(&b, m, "tokenizer.ggml.tokens", GGUF_T_ARRAY);
    gb_u32(&b, GGUF_T_STRING);
    gb_u64(&b, 3);
    gb_str(&b, "a");
    gb_str(&b, "");
    gb_str(&b, "hello");
    gb_key(&b, m, "t.arr_i32", GGUF_T_ARRAY);
    gb_u32(&b, GGUF_T_INT32);
    gb_u64(&b, 4);
    for (int32_t i = 0; i < 4; i++)
        gb_put(&b, &(int32_t){i * 10 - 5}, 4);
    gb_key(&b, m, "t.nested", GGUF_T_ARRAY); /* [[1,2],[],["x"]] */
    gb_u32(&b, GGUF_T_ARRAY);
    gb_u64(&b, 3);
    gb_u32(&b, GGUF_T_UINT16);
    gb_u64(&b, 2);
    gb_put(&b, &(uint16_t){1}, 2);
    gb_put(&b, &(uint16_t){2}, 2);
    gb_u32(&b, GGUF_T_FLOAT32);
    gb_u64(&b, 0);
    gb_u32(&b, GGUF_T_STRING);
    gb_u64(&b, 1);
    gb_str(&b, "x");
    gb_key(&b, m, "t.bools", GGUF_T_ARRAY);
    gb_u32(&b, GGUF_T_BOOL);
    gb_u64(&b, 2);
    gb_u8(&b, 0);
    gb_u8(&b, 1);
    gb_key(&b, m, "t.str", GGUF_T_STRING);
    gb_str(&b, "with\nnewline");
    gb_key(&b, m, "t.empty", GGUF_T_ARRAY);
    gb_u32(&b, GGUF_T_UINT8);
    gb_u64(&b, 0);

    size_t off = 0, end = 0;
    for (int i = 0; i < GB_NT; i++) {
        m->tensor[i] = b.len;
        gb_str(&b, gb_tensors[i].name);
        m->tensor_ndims[i] = b.len;
        gb_u32(&b, 2);
        m->tensor_dims[i] = b.len;
        gb_u64(&b, (uint64_t)gb_tensors[i].ne0);
        gb_u64(&b, (uint64_t)gb_tensors[i].ne1);
        m->tensor_type[i] = b.len;
        gb_u32(&b, (uint32_t)gb_tensors[i].type);
        m->tensor_off[i] = b.len;
        gb_u64(&b, off);
        off += md_type_row_bytes(gb_tensors[i].type, gb_tensors[i].ne0) * (size_t)gb_tensors[i].ne1;
        end = off; /* no padding after the last tensor */
        off = (off + GB_ALIGN - 1) / GB_ALIGN * GB_ALIGN;
    }
    m->nt = GB_NT;
    gb_pad(&b, GB_ALIGN);
    m->data = b.len;
    for (size_t i = 0; i < end; i++)
        gb_u8(&b, (uint8_t)((i * 37 + 11) % 0x78));
    return b;
}

#endif
