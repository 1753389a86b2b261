/* safetensors.h — read-only safetensors files (Hugging Face's weight format), one file or the
 * shards of an index (model.safetensors.index.json).
 *
 * A file is: u64 little-endian header length N | N bytes of a JSON object | the byte buffer.
 * The object maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the buffer) and may hold "__metadata__" (an object of strings, ignored).
 * st_open*() map and validate everything before returning (docs/models.md, "safetensors"):
 * the header length (at least 2, at most ST_MAX_HEADER, inside the file), the JSON (an object,
 * no duplicate names, no unknown keys in an entry), each dtype (F32, F16, BF16, and I64 for
 * buffers such as BERT's position_ids, which no weight may be; any other is
 * MD_EUNSUPP naming it), each shape (0 to ST_MAX_DIMS non-negative dimensions whose product
 * does not overflow), each data_offsets span (begin <= end, end inside the buffer, end - begin
 * = elements x dtype size, begin aligned to the element size in the file) and that the spans
 * tile the buffer in order without overlap or hole, as the format requires. After a successful
 * open no accessor can read out of bounds. Errors are MD_EFORMAT (MD_EUNSUPP for a dtype) with
 * a sentence naming the file and the tensor.
 *
 * Ownership: st_file owns its mappings (or, for st_open_mem, borrows the caller's buffer);
 * every pointer handed out (names, data) lives until st_close(). Read-only after open: any
 * number of threads may use the accessors. */
#ifndef MEDLEY_ENGINE_SAFETENSORS_H
#define MEDLEY_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* bytes; the reference implementation's limit too */
#define ST_MAX_NAME 1024           /* longest tensor name accepted, bytes */
#define ST_MAX_SHARDS 4096

typedef struct st_file st_file;

typedef struct {
    const char *name;           /* NUL-terminated copy owned by st_file */
    int type;                   /* MD_TYPE_F32, MD_TYPE_F16 or MD_TYPE_BF16 (common/dtype.h) */
    int n_dims;                 /* 0..ST_MAX_DIMS (0: a scalar of one element) */
    int64_t shape[ST_MAX_DIMS]; /* outermost first, as written (PyTorch order) */
    int64_t n_elements;
    size_t n_bytes;
    const void *data; /* into the mapping; aligned to the element size */
    int shard;        /* index of the file that holds it (st_shard_path) */
} st_tensor;

/* One .safetensors file. */
int st_open(const char *path, st_file **out, md_err *e);
/* The same over a caller-owned buffer (the fuzzer); label names it in errors. buf must outlive
 * the file. */
int st_open_mem(const void *buf, size_t len, const char *label, st_file **out, md_err *e);
/* A Hugging Face model directory's weights: DIR/model.safetensors.index.json when present (its
 * "weight_map" names, for every tensor, a shard file in DIR; each shard is opened once, every
 * tensor of the map must be in its shard and no name may be in two shards), else
 * DIR/model.safetensors. MD_ENOTFOUND when neither exists. */
int st_open_dir(const char *dir, st_file **out, md_err *e);
void st_close(st_file *f); /* NULL is a no-op */

int64_t st_n_tensors(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, int64_t i);   /* sorted by name */
const st_tensor *st_find(const st_file *f, const char *name); /* NULL if absent */
int st_n_shards(const st_file *f);
const char *st_shard_path(const st_file *f, int i);
/* Bytes of all tensor data (the sum of n_bytes). */
size_t st_data_bytes(const st_file *f);
/* "F32", "F16", "BF16" for the md_type of a tensor. */
const char *st_dtype_name(int type);

#endif
