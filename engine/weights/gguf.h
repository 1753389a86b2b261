/* gguf.h — read-only GGUF v2/v3 model files (llama.cpp's format).
 *
 * gguf_open() mmaps the file and validates everything before returning: header,
 * every metadata key/value (all value types, nested arrays), the tensor directory,
 * alignment, and that every tensor's bytes lie inside the file. After a successful
 * open, no accessor can read out of bounds. Truncated, corrupted or hostile files give
 * MD_EFORMAT with a sentence naming the problem (which key/tensor, which offset);
 * version 1 and big-endian files give MD_EUNSUPP. The rules are listed in docs/models.md.
 * Nothing changes after open: accessors may be called from any number of threads.
 *
 * Ownership: gguf_file owns the mapping; every pointer handed out (strings, arrays,
 * tensor data) points into it and lives until gguf_close(). */
#ifndef MEDLEY_ENGINE_GGUF_H
#define MEDLEY_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Metadata value types, numbered as in the GGUF spec. */
typedef enum {
    GGUF_T_UINT8 = 0,
    GGUF_T_INT8 = 1,
    GGUF_T_UINT16 = 2,
    GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5,
    GGUF_T_FLOAT32 = 6,
    GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10,
    GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
} gguf_vtype;

typedef struct gguf_file gguf_file;

typedef struct {
    const char *name; /* NUL-terminated copy owned by gguf_file */
    int type;         /* md_type (common/dtype.h): any GGUF type */
    int n_dims;       /* 1..4 */
    int64_t ne[4];    /* elements per dim, ne[0] innermost (row length); unused dims = 1 */
    int64_t n_elements;
    size_t n_bytes;
    const void *data; /* into the mapping; its file offset is a multiple of the alignment
                         (so the pointer is aligned too for gguf_open's page-aligned map) */
} gguf_tensor;

/* Open and fully validate path. On success *out owns the mapping. */
int gguf_open(const char *path, gguf_file **out, md_err *e);
/* Same, over a caller-owned memory buffer (used by the fuzzer); buf must outlive the file. */
int gguf_open_mem(const void *buf, size_t len, gguf_file **out, md_err *e);
/* A gguf_file assembled from parts (an HF directory, engine/weights/hf_model.h): the metadata of the
 * GGUF image meta (malloc'd, holding no tensors; parsed and validated as a file is) and the
 * tensors of the table (copied, names too), whose data lie in memory kept alive by owner.
 * Takes ownership of meta (free) and owner (release(owner), release may be NULL) on every
 * path, failure included: gguf_close releases them. Each tensor's type, shape and n_bytes
 * must agree and names be unique (MD_EINVAL naming the tensor). gguf_file_size is meta_len
 * plus the tensors' bytes. */
int gguf_open_parts(void *meta, size_t meta_len, const gguf_tensor *tensors, int64_t n,
                    void (*release)(void *), void *owner, gguf_file **out, md_err *e);
void gguf_close(gguf_file *f);
/* Give back the pages of [p, p + n) that lie wholly inside f's file mapping (madvise
 * MADV_DONTNEED: the mapping is private and never written, so a later read pages the file in
 * again; nothing for a file held in memory, or bytes outside the mapping). For tensors a
 * backend copied at load (backend.h weight_wrap), so that they are not resident twice. */
void gguf_drop_pages(const gguf_file *f, const void *p, size_t n);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
size_t gguf_file_size(const gguf_file *f);
/* Byte offset of the tensor data section (tensor offsets are relative to it). */
size_t gguf_data_offset(const gguf_file *f);
/* Name of a metadata value type ("uint32", "string", ...); "unknown" if out of range. */
const char *gguf_vtype_name(int t);

/* Metadata. Key lookup returns index or -1. */
int64_t gguf_n_kv(const gguf_file *f);
int64_t gguf_find_key(const gguf_file *f, const char *key);
const char *gguf_key_name(const gguf_file *f, int64_t i);
gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i);
/* Typed getters by key: return 0 and set *out, MD_ENOTFOUND if absent, MD_EFORMAT if of
 * another type (integers of any width convert when the value fits). */
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, md_err *e);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, md_err *e);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, md_err *e); /* any number */
int gguf_get_bool(const gguf_file *f, const char *key, int *out, md_err *e);
/* Strings are not NUL-terminated in the file: pointer + length. */
int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len, md_err *e);
/* Arrays: element type and count; for nested arrays elem type is GGUF_T_ARRAY. */
int gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type, uint64_t *n,
                 md_err *e);
/* Element i of a string array (O(1): offsets are indexed at open). */
int gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, const char **s, size_t *len,
                 md_err *e);
/* Raw pointer to a numeric array's elements (little-endian, packed, possibly unaligned:
 * memcpy before use). */
int gguf_arr_data(const gguf_file *f, const char *key, const void **data, md_err *e);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

#endif
