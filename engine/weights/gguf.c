/* gguf.c — the GGUF reader: mmap, validation at open, metadata and tensor directory.
 *
 * Everything a later accessor could touch is checked once in gguf_open_mem(): every length,
 * count and offset is compared to the bytes that remain before it is used, so the
 * accessors below index validated tables and never re-check. The layout (GGUF v2/v3):
 *
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to general.alignment | tensor data (offsets relative to here)
 *
 * string = u64 length + bytes (no NUL); array = u32 elem type + u64 count + elements.
 * Element type sizes live in common/dtype.c, dequantization in quant.c. */
#include "engine/weights/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dtype.h"

#define GGUF_MAX_DEPTH 8      /* nested arrays deeper than this are rejected */
#define GGUF_MAX_NAME 256     /* longest tensor name accepted, bytes */
#define GGUF_MAX_KEY 65536    /* longest metadata key accepted, bytes */
#define GGUF_DEFAULT_ALIGN 32 /* when general.alignment is absent */

typedef struct {
    char *key;            /* NUL-terminated copy */
    gguf_vtype type;      /* value type */
    const uint8_t *val;   /* scalar value, string bytes, or first array element */
    uint64_t len;         /* string length in bytes */
    gguf_vtype elem_type; /* arrays only */
    uint64_t n;           /* arrays only: element count */
    uint64_t *str_offs;   /* arrays of strings: offset of each element's u64 length */
} gguf_kv;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    int mapped; /* base is our mmap (munmap at close) */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t *kv_sorted; /* kv indices sorted by key, for lookup and duplicate checks */
    int64_t n_tensors;
    gguf_tensor *tensors;
    int64_t *t_sorted; /* tensor indices sorted by name */
    /* gguf_open_parts: the metadata image (freed at close), the tensors' bytes' owner */
    void *meta_owned;
    size_t parts_bytes;
    void (*release)(void *);
    void *owner;
};

/* A cursor over the buffer; every read checks the bytes that remain. */
typedef struct {
    const uint8_t *p;
    size_t size;
    size_t pos;
    md_err *e;
} rd;

static size_t rd_left(const rd *r) {
    return r->size - r->pos;
}

static int rd_need(rd *r, uint64_t n, const char *what) {
    if (n > rd_left(r))
        return md_errf(r->e, MD_EFORMAT,
                       "truncated: %s needs %llu bytes at offset %zu but the file ends at %zu",
                       what, (unsigned long long)n, r->pos, r->size);
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *what) {
    if (rd_need(r, 4, what))
        return MD_EFORMAT;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v, const char *what) {
    if (rd_need(r, 8, what))
        return MD_EFORMAT;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return 0;
}

/* A string: returns its bytes (in the buffer) and length after checking both fit. */
static int rd_str(rd *r, const uint8_t **s, uint64_t *len, const char *what) {
    size_t at = r->pos;
    if (rd_u64(r, len, what))
        return MD_EFORMAT;
    if (*len > rd_left(r))
        return md_errf(r->e, MD_EFORMAT,
                       "%s at offset %zu claims %llu bytes but only %zu remain in the file", what,
                       at, (unsigned long long)*len, rd_left(r));
    *s = r->p + r->pos;
    r->pos += *len;
    return 0;
}

static size_t vtype_size(uint32_t t) {
    switch (t) {
    case GGUF_T_UINT8:
    case GGUF_T_INT8:
    case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16:
    case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32:
    case GGUF_T_INT32:
    case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64:
    case GGUF_T_INT64:
    case GGUF_T_FLOAT64: return 8;
    default: return 0; /* string, array, unknown */
    }
}

static const char *vtype_name(uint32_t t) {
    static const char *names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                  "int32",  "float32", "bool",   "string", "array",
                                  "uint64", "int64",   "float64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Skip (and validate) one value of type t; depth counts array nesting. */
static int skip_value(rd *r, uint32_t t, int depth, const char *key) {
    size_t sz = vtype_size(t);
    if (sz) {
        if (rd_need(r, sz, "a metadata value"))
            return md_errctx(r->e, "key '%s': ", key);
        if (t == GGUF_T_BOOL && r->p[r->pos] > 1)
            return md_errf(r->e, MD_EFORMAT, "key '%s': bool value %u at offset %zu is not 0 or 1",
                           key, r->p[r->pos], r->pos);
        r->pos += sz;
        return 0;
    }
    if (t == GGUF_T_STRING) {
        const uint8_t *s;
        uint64_t len;
        if (rd_str(r, &s, &len, "a string value"))
            return md_errctx(r->e, "key '%s': ", key);
        return 0;
    }
    if (t != GGUF_T_ARRAY)
        return md_errf(r->e, MD_EFORMAT, "key '%s': unknown value type %u at offset %zu", key, t,
                       r->pos - 4);
    if (depth >= GGUF_MAX_DEPTH)
        return md_errf(r->e, MD_EFORMAT, "key '%s': arrays nested deeper than %d at offset %zu",
                       key, GGUF_MAX_DEPTH, r->pos);
    uint32_t et;
    uint64_t n;
    if (rd_u32(r, &et, "an array element type") || rd_u64(r, &n, "an array length"))
        return md_errctx(r->e, "key '%s': ", key);
    size_t esz = vtype_size(et);
    if (esz) {
        if (n > rd_left(r) / esz)
            return md_errf(r->e, MD_EFORMAT,
                           "key '%s': array of %llu %s elements at offset %zu needs more than "
                           "the %zu bytes left in the file",
                           key, (unsigned long long)n, vtype_name(et), r->pos - 12, rd_left(r));
        if (et == GGUF_T_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (r->p[r->pos + i] > 1)
                    return md_errf(r->e, MD_EFORMAT,
                                   "key '%s': bool element %llu is %u, not 0 or 1", key,
                                   (unsigned long long)i, r->p[r->pos + i]);
        }
        r->pos += n * esz;
        return 0;
    }
    if (et != GGUF_T_STRING && et != GGUF_T_ARRAY)
        return md_errf(r->e, MD_EFORMAT, "key '%s': unknown array element type %u at offset %zu",
                       key, et, r->pos - 12);
    /* Each string or nested array takes at least 8 bytes: bounds the loop by the file. */
    if (n > rd_left(r) / 8)
        return md_errf(r->e, MD_EFORMAT,
                       "key '%s': array claims %llu elements at offset %zu but only %zu bytes "
                       "remain",
                       key, (unsigned long long)n, r->pos - 12, rd_left(r));
    for (uint64_t i = 0; i < n; i++) {
        int rc = skip_value(r, et, depth + 1, key);
        if (rc)
            return rc;
    }
    return 0;
}

/* A merge sort of indices with a context (qsort has none, qsort_r is not portable). */
static void sort_idx(int64_t *idx, int64_t *tmp, int64_t n, const void *ctx,
                     int (*cmp)(const void *, const void *, void *)) {
    if (n < 2)
        return;
    int64_t h = n / 2;
    sort_idx(idx, tmp, h, ctx, cmp);
    sort_idx(idx + h, tmp, n - h, ctx, cmp);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp(&idx[j], &idx[i], (void *)ctx) < 0 ? idx[j++] : idx[i++];
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

static int cmp_kv_fn(const void *a, const void *b, void *ctx) {
    const gguf_file *f = ctx;
    return strcmp(f->kv[*(const int64_t *)a].key, f->kv[*(const int64_t *)b].key);
}

static int cmp_t_name(const void *a, const void *b, void *ctx) {
    const gguf_file *f = ctx;
    return strcmp(f->tensors[*(const int64_t *)a].name, f->tensors[*(const int64_t *)b].name);
}

static int cmp_t_off(const void *a, const void *b, void *ctx) {
    const gguf_file *f = ctx;
    const uint8_t *x = f->tensors[*(const int64_t *)a].data;
    const uint8_t *y = f->tensors[*(const int64_t *)b].data;
    return x < y ? -1 : x > y;
}

static int sort_index(int64_t **out, int64_t n, const gguf_file *f,
                      int (*cmp)(const void *, const void *, void *), md_err *e) {
    int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    int64_t *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return md_errf(e, MD_ENOMEM, "out of memory sorting %lld entries", (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        idx[i] = i;
    sort_idx(idx, tmp, n, f, cmp);
    free(tmp);
    *out = idx;
    return 0;
}

/* Copy a length-delimited name to a NUL-terminated string, refusing embedded NULs. */
static char *dup_name(const uint8_t *s, uint64_t len) {
    if (memchr(s, 0, len))
        return NULL;
    char *c = malloc(len + 1);
    if (c) {
        memcpy(c, s, len);
        c[len] = 0;
    }
    return c;
}

static int parse_kv(gguf_file *f, rd *r, int64_t i) {
    gguf_kv *kv = &f->kv[i];
    size_t at = r->pos;
    const uint8_t *ks = NULL; /* set by rd_str; gcc cannot see it through md_errf */
    uint64_t klen;
    if (rd_str(r, &ks, &klen, "a metadata key"))
        return md_errctx(r->e, "metadata entry %lld: ", (long long)i);
    if (klen == 0 || klen > GGUF_MAX_KEY)
        return md_errf(r->e, MD_EFORMAT,
                       "metadata entry %lld at offset %zu: key length %llu "
                       "is outside 1..%d",
                       (long long)i, at, (unsigned long long)klen, GGUF_MAX_KEY);
    if (memchr(ks, 0, klen))
        return md_errf(r->e, MD_EFORMAT,
                       "metadata entry %lld at offset %zu: key contains a NUL byte", (long long)i,
                       at);
    kv->key = dup_name(ks, klen);
    if (!kv->key)
        return md_errf(r->e, MD_ENOMEM, "out of memory copying a metadata key");
    uint32_t t;
    if (rd_u32(r, &t, "a value type"))
        return md_errctx(r->e, "key '%s': ", kv->key);
    if (t > GGUF_T_FLOAT64)
        return md_errf(r->e, MD_EFORMAT, "key '%s': unknown value type %u at offset %zu", kv->key,
                       t, r->pos - 4);
    kv->type = (gguf_vtype)t;
    if (t == GGUF_T_STRING) {
        size_t sat = r->pos;
        if (skip_value(r, t, 0, kv->key))
            return MD_EFORMAT;
        memcpy(&kv->len, r->p + sat, 8);
        kv->val = r->p + sat + 8;
        return 0;
    }
    if (t != GGUF_T_ARRAY) {
        kv->val = r->p + r->pos;
        return skip_value(r, t, 0, kv->key);
    }
    size_t aat = r->pos;
    if (skip_value(r, t, 0, kv->key))
        return MD_EFORMAT;
    uint32_t et;
    memcpy(&et, r->p + aat, 4);
    memcpy(&kv->n, r->p + aat + 4, 8);
    kv->elem_type = (gguf_vtype)et;
    kv->val = r->p + aat + 12;
    if (et == GGUF_T_STRING) {
        /* validated above: n strings each with a length that fits */
        kv->str_offs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str_offs);
        if (!kv->str_offs)
            return md_errf(r->e, MD_ENOMEM, "key '%s': out of memory indexing %llu strings",
                           kv->key, (unsigned long long)kv->n);
        size_t p = aat + 12;
        for (uint64_t j = 0; j < kv->n; j++) {
            uint64_t len;
            kv->str_offs[j] = p;
            memcpy(&len, r->p + p, 8);
            p += 8 + len;
        }
    }
    return 0;
}

static int parse_tensor(gguf_file *f, rd *r, int64_t i) {
    gguf_tensor *t = &f->tensors[i];
    size_t at = r->pos;
    const uint8_t *ns;
    uint64_t nlen;
    if (rd_str(r, &ns, &nlen, "a tensor name"))
        return md_errctx(r->e, "tensor %lld: ", (long long)i);
    if (nlen == 0 || nlen > GGUF_MAX_NAME)
        return md_errf(r->e, MD_EFORMAT,
                       "tensor %lld at offset %zu: name length %llu is outside 1..%d", (long long)i,
                       at, (unsigned long long)nlen, GGUF_MAX_NAME);
    t->name = dup_name(ns, nlen);
    if (!t->name)
        return md_errf(r->e, MD_EFORMAT, "tensor %lld at offset %zu: name contains a NUL byte",
                       (long long)i, at);
    uint32_t nd;
    if (rd_u32(r, &nd, "a dimension count"))
        return md_errctx(r->e, "tensor '%s': ", t->name);
    if (nd < 1 || nd > 4)
        return md_errf(r->e, MD_EFORMAT, "tensor '%s': %u dimensions, expected 1 to 4", t->name,
                       nd);
    t->n_dims = (int)nd;
    int64_t n = 1;
    for (int d = 0; d < 4; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && rd_u64(r, &ne, "a dimension"))
            return md_errctx(r->e, "tensor '%s': ", t->name);
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return md_errf(r->e, MD_EFORMAT, "tensor '%s': dimension %d is %llu", t->name, d,
                           (unsigned long long)ne);
        if ((uint64_t)n > (uint64_t)INT64_MAX / ne)
            return md_errf(r->e, MD_EFORMAT,
                           "tensor '%s': dimensions overflow a 64-bit element count", t->name);
        t->ne[d] = (int64_t)ne;
        n *= (int64_t)ne;
    }
    t->n_elements = n;
    uint32_t type;
    if (rd_u32(r, &type, "a tensor type"))
        return md_errctx(r->e, "tensor '%s': ", t->name);
    int bs = md_type_block((int)type);
    if (!bs)
        return md_errf(r->e, MD_EFORMAT, "tensor '%s': unknown element type %u", t->name, type);
    t->type = (int)type;
    if (t->ne[0] % bs)
        return md_errf(r->e, MD_EFORMAT,
                       "tensor '%s': row length %lld is not a multiple of %s's block of %d",
                       t->name, (long long)t->ne[0], md_type_name(t->type), bs);
    /* bytes = n / bs * type_size; check it against size_t and the file before computing */
    uint64_t blocks = (uint64_t)n / (uint64_t)bs;
    size_t ts = md_type_block_bytes(t->type);
    if (blocks > (uint64_t)SIZE_MAX / ts || blocks * ts > f->size)
        return md_errf(r->e, MD_EFORMAT,
                       "tensor '%s': %lld elements of %s need more bytes than the whole file "
                       "(%zu)",
                       t->name, (long long)n, md_type_name(t->type), f->size);
    t->n_bytes = (size_t)(blocks * ts);
    uint64_t off;
    if (rd_u64(r, &off, "a tensor offset"))
        return md_errctx(r->e, "tensor '%s': ", t->name);
    /* keep the raw offset in data until the data section start is known */
    t->data = (const void *)(uintptr_t)off;
    return 0;
}

/* Grow a zeroed table to the next capacity (doubling, at most max entries). */
static int grow(void **arr, int64_t *cap, int64_t max, size_t elsz, md_err *e) {
    int64_t ncap = *cap ? *cap * 2 : 64;
    if (ncap > max)
        ncap = max;
    void *p = realloc(*arr, (size_t)ncap * elsz);
    if (!p)
        return md_errf(e, MD_ENOMEM, "out of memory for %lld table entries", (long long)ncap);
    memset((char *)p + (size_t)*cap * elsz, 0, (size_t)(ncap - *cap) * elsz);
    *arr = p;
    *cap = ncap;
    return 0;
}

/* The first name that stands twice in a table whose index sorted is in name order, or NULL. */
static const char *repeated_name(const gguf_file *f, const int64_t *sorted, int64_t n,
                                 const char *(*name)(const gguf_file *, int64_t)) {
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(name(f, sorted[i]), name(f, sorted[i - 1])))
            return name(f, sorted[i]);
    return NULL;
}

static const char *kv_name(const gguf_file *f, int64_t i) {
    return f->kv[i].key;
}
static const char *tensor_name(const gguf_file *f, int64_t i) {
    return f->tensors[i].name;
}

/* One of the header's two tables: the metadata key/values or the tensor infos. */
typedef struct {
    const char *what; /* what its names are, for messages */
    size_t entry_bytes;
    int (*parse)(gguf_file *f, rd *r, int64_t i);   /* entry i, into room the table has */
    int (*cmp)(const void *, const void *, void *); /* index order by name */
    const char *(*name)(const gguf_file *f, int64_t i);
} table_kind;

static const table_kind k_kv_table = {"metadata key", sizeof(gguf_kv), parse_kv, cmp_kv_fn,
                                      kv_name};
static const table_kind k_tensor_table = {"tensor name", sizeof(gguf_tensor), parse_tensor,
                                          cmp_t_name, tensor_name};

/* n entries of a table into *arr, which grows as entries actually parse (a lying count costs
 * no memory); *count is what parsed so far (gguf_free releases it on error). Then *sorted
 * indexes it by name, and a name that stands twice is MD_EFORMAT. */
static int parse_table(gguf_file *f, rd *r, uint64_t n, void **arr, int64_t *count,
                       int64_t **sorted, const table_kind *k, md_err *e) {
    int64_t cap = 0;
    for (int64_t i = 0; i < (int64_t)n; i++) {
        if (i == cap && grow(arr, &cap, (int64_t)n, k->entry_bytes, e))
            return MD_ENOMEM;
        *count = i + 1;
        int rc = k->parse(f, r, i);
        if (rc)
            return rc;
    }
    if (sort_index(sorted, *count, f, k->cmp, e))
        return MD_ENOMEM;
    const char *twice = repeated_name(f, *sorted, *count, k->name);
    if (twice)
        return md_errf(e, MD_EFORMAT, "duplicate %s '%s'", k->what, twice);
    return 0;
}

/* e is never NULL here (the public entry points substitute a local one). */
static int gguf_parse(gguf_file *f, md_err *e) {
    rd r = {f->base, f->size, 0, e};
    int rc;
    if (f->size < 4 || memcmp(f->base, "GGUF", 4) != 0)
        return md_errf(e, MD_EFORMAT, "not a GGUF file: the first 4 bytes are not \"GGUF\"");
    r.pos = 4;
    uint32_t v;
    if (rd_u32(&r, &v, "the version"))
        return MD_EFORMAT;
    if (v == 0x03000000 || v == 0x02000000)
        return md_errf(e, MD_EUNSUPP, "big-endian GGUF files are not supported");
    if (v == 1)
        return md_errf(e, MD_EUNSUPP,
                       "GGUF version 1 (32-bit counts) is not supported; "
                       "convert it to version 3");
    if (v != 2 && v != 3)
        return md_errf(e, MD_EFORMAT, "unknown GGUF version %u (expected 2 or 3)", v);
    f->version = v;
    uint64_t nt, nkv;
    if (rd_u64(&r, &nt, "the tensor count") || rd_u64(&r, &nkv, "the metadata count"))
        return MD_EFORMAT;
    /* a key/value takes at least 13 bytes, a tensor entry at least 32: bound both by the file */
    if (nkv > rd_left(&r) / 13)
        return md_errf(e, MD_EFORMAT,
                       "header claims %llu metadata entries but the file has room for at most "
                       "%zu",
                       (unsigned long long)nkv, rd_left(&r) / 13);
    if (nt > rd_left(&r) / 32)
        return md_errf(e, MD_EFORMAT,
                       "header claims %llu tensors but the file has room for at most %zu",
                       (unsigned long long)nt, rd_left(&r) / 32);
    if ((rc = parse_table(f, &r, nkv, (void **)&f->kv, &f->n_kv, &f->kv_sorted, &k_kv_table, e)))
        return rc;

    f->alignment = GGUF_DEFAULT_ALIGN;
    int64_t ai = gguf_find_key(f, "general.alignment");
    if (ai >= 0) {
        const gguf_kv *kv = &f->kv[ai];
        uint32_t a = 0;
        if (kv->type != GGUF_T_UINT32)
            return md_errf(e, MD_EFORMAT, "general.alignment is a %s, expected uint32",
                           vtype_name(kv->type));
        memcpy(&a, kv->val, 4);
        if (a == 0 || (a & (a - 1)))
            return md_errf(e, MD_EFORMAT, "general.alignment is %u, expected a power of two", a);
        f->alignment = a;
    }

    if (nt > rd_left(&r) / 32)
        return md_errf(e, MD_EFORMAT,
                       "header claims %llu tensors but after the metadata the file has room for "
                       "at most %zu",
                       (unsigned long long)nt, rd_left(&r) / 32);
    if ((rc = parse_table(f, &r, nt, (void **)&f->tensors, &f->n_tensors, &f->t_sorted,
                          &k_tensor_table, e)))
        return rc;

    size_t pad = (f->alignment - r.pos % f->alignment) % f->alignment;
    if (f->n_tensors > 0 && pad > rd_left(&r))
        return md_errf(e, MD_EFORMAT,
                       "truncated: the tensor data section (offset %zu after alignment) starts "
                       "past the end of the file (%zu bytes)",
                       r.pos + pad, f->size);
    f->data_offset = r.pos + pad;
    size_t data_size = f->data_offset <= f->size ? f->size - f->data_offset : 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t off = (uint64_t)(uintptr_t)t->data;
        if (off % f->alignment)
            return md_errf(e, MD_EFORMAT,
                           "tensor '%s': offset %llu is not a multiple of the "
                           "alignment %zu",
                           t->name, (unsigned long long)off, f->alignment);
        if (off > data_size || t->n_bytes > data_size - off)
            return md_errf(e, MD_EFORMAT,
                           "tensor '%s': its %zu bytes at data offset %llu end past the end of "
                           "the file (data section is %zu bytes)",
                           t->name, t->n_bytes, (unsigned long long)off, data_size);
        t->data = f->base + f->data_offset + off;
    }
    /* tensors must not overlap */
    int64_t *by_off = NULL;
    if (sort_index(&by_off, f->n_tensors, f, cmp_t_off, e))
        return MD_ENOMEM;
    for (int64_t i = 1; i < f->n_tensors; i++) {
        const gguf_tensor *a = &f->tensors[by_off[i - 1]], *b = &f->tensors[by_off[i]];
        if ((const uint8_t *)a->data + a->n_bytes > (const uint8_t *)b->data) {
            int rc = md_errf(e, MD_EFORMAT, "tensors '%s' and '%s' overlap in the data section",
                             a->name, b->name);
            free(by_off);
            return rc;
        }
    }
    free(by_off);
    return 0;
}

static void gguf_free(gguf_file *f) {
    if (!f)
        return;
    if (f->kv)
        for (int64_t i = 0; i < f->n_kv; i++) {
            free(f->kv[i].key);
            free(f->kv[i].str_offs);
        }
    if (f->tensors)
        for (int64_t i = 0; i < f->n_tensors; i++)
            free((char *)f->tensors[i].name);
    free(f->kv);
    free(f->kv_sorted);
    free(f->tensors);
    free(f->t_sorted);
    if (f->mapped && f->base)
        munmap((void *)f->base, f->size);
    free(f->meta_owned);
    if (f->release)
        f->release(f->owner);
    free(f);
}

int gguf_open_mem(const void *buf, size_t len, gguf_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    if (!buf && len)
        return md_errf(e, MD_EINVAL, "gguf_open_mem: NULL buffer");
    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "out of memory");
    f->base = buf;
    f->size = len;
    int rc = gguf_parse(f, e);
    if (rc) {
        gguf_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_open_parts(void *meta, size_t meta_len, const gguf_tensor *tensors, int64_t n,
                    void (*release)(void *), void *owner, gguf_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(meta);
        if (release)
            release(owner);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    f->base = meta;
    f->size = meta_len;
    f->meta_owned = meta;
    f->release = release;
    f->owner = owner;
    int rc = gguf_parse(f, e);
    if (rc == 0 && f->n_tensors)
        rc = md_errf(e, MD_EINVAL, "gguf_open_parts: the metadata image holds tensors");
    if (rc == 0 && (n < 0 || !(f->tensors = calloc((size_t)(n ? n : 1), sizeof *f->tensors))))
        rc = md_errf(e, MD_ENOMEM, "out of memory for %lld tensors", (long long)n);
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        const gguf_tensor *s = &tensors[i];
        gguf_tensor *t = &f->tensors[i];
        *t = *s;
        t->name = NULL;
        f->n_tensors = i + 1;
        size_t nl = s->name ? strlen(s->name) : 0;
        int bs = md_type_block(s->type);
        int64_t ne = 1;
        for (int d = 0; d < 4; d++)
            ne = s->ne[d] > 0 && ne <= INT64_MAX / s->ne[d] ? ne * s->ne[d] : -1;
        if (nl == 0 || nl > GGUF_MAX_NAME || !(t->name = strdup(s->name)))
            rc = md_errf(e, MD_EINVAL, "gguf_open_parts: tensor %lld has no usable name",
                         (long long)i);
        else if (!bs || s->n_dims < 1 || s->n_dims > 4 || ne != s->n_elements || s->ne[0] % bs ||
                 !s->data || (size_t)(ne / bs) * md_type_block_bytes(s->type) != s->n_bytes)
            rc = md_errf(e, MD_EINVAL,
                         "gguf_open_parts: tensor '%s': type, shape and byte count disagree",
                         s->name);
        else
            f->parts_bytes += s->n_bytes;
    }
    if (rc == 0) { /* the metadata parse indexed its zero tensors */
        free(f->t_sorted);
        f->t_sorted = NULL;
        rc = sort_index(&f->t_sorted, f->n_tensors, f, cmp_t_name, e);
    }
    const char *twice = rc ? NULL : repeated_name(f, f->t_sorted, f->n_tensors, tensor_name);
    if (twice)
        rc = md_errf(e, MD_EINVAL, "gguf_open_parts: duplicate tensor name '%s'", twice);
    if (rc) {
        gguf_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, gguf_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    /* O_NONBLOCK: a FIFO's open would wait for a writer; fstat below refuses it instead */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return md_errf(e, errno == ENOENT ? MD_ENOTFOUND : MD_EIO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return md_errf(e, MD_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return md_errf(e, MD_EFORMAT, "%s: the file is empty", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED)
        return md_errf(e, MD_EIO, "%s: mmap failed: %s", path, strerror(err));
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(m, (size_t)st.st_size);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    f->base = m;
    f->size = (size_t)st.st_size;
    f->mapped = 1;
    int rc = gguf_parse(f, e);
    if (rc) {
        gguf_free(f);
        md_errctx(e, "%s: ", path);
        return rc;
    }
    *out = f;
    return 0;
}

void gguf_drop_pages(const gguf_file *f, const void *p, size_t n) {
    if (!f || !f->mapped || !p || n == 0)
        return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n, b0 = (uintptr_t)f->base, b1 = b0 + f->size;
    if (lo < b0 || hi > b1 || hi < lo)
        return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    lo = (lo + pg - 1) / pg * pg; /* only pages wholly inside: a neighbour's stay */
    hi = hi / pg * pg;
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void gguf_close(gguf_file *f) {
    gguf_free(f);
}

uint32_t gguf_version(const gguf_file *f) {
    return f->version;
}
size_t gguf_alignment(const gguf_file *f) {
    return f->alignment;
}
size_t gguf_file_size(const gguf_file *f) {
    return f->size + f->parts_bytes;
}
size_t gguf_data_offset(const gguf_file *f) {
    return f->data_offset;
}

int64_t gguf_n_kv(const gguf_file *f) {
    return f->n_kv;
}

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    int64_t lo = 0, hi = f->n_kv - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->kv[f->kv_sorted[mid]].key, key);
        if (c == 0)
            return f->kv_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const char *gguf_key_name(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? f->kv[i].key : NULL;
}

gguf_vtype gguf_kv_type(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_kv ? f->kv[i].type : (gguf_vtype)-1;
}

const char *gguf_vtype_name(int t) {
    return t >= 0 ? vtype_name((uint32_t)t) : "unknown";
}

static int find_kv(const gguf_file *f, const char *key, const gguf_kv **kv, md_err *e) {
    int64_t i = gguf_find_key(f, key);
    if (i < 0)
        return md_errf(e, MD_ENOTFOUND, "metadata key '%s' is absent", key);
    *kv = &f->kv[i];
    return 0;
}

/* An integer value as signed/unsigned parts: returns 1 when the value is an integer. */
static int kv_int(const gguf_kv *kv, int *neg, uint64_t *mag) {
    const uint8_t *p = kv->val;
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 0;
    switch (kv->type) {
    case GGUF_T_UINT8: u = p[0]; break;
    case GGUF_T_INT8: s = (int8_t)p[0], is_signed = 1; break;
    case GGUF_T_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        u = x;
    } break;
    case GGUF_T_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        s = x, is_signed = 1;
    } break;
    case GGUF_T_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        u = x;
    } break;
    case GGUF_T_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        s = x, is_signed = 1;
    } break;
    case GGUF_T_UINT64: memcpy(&u, p, 8); break;
    case GGUF_T_INT64: memcpy(&s, p, 8), is_signed = 1; break;
    default: return 0;
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = 0;
        *mag = u;
    }
    return 1;
}

/* The integer at key as sign and magnitude; MD_ENOTFOUND, or MD_EFORMAT for another type. */
static int get_int(const gguf_file *f, const char *key, int *neg, uint64_t *mag, md_err *e) {
    const gguf_kv *kv = NULL;
    if (find_kv(f, key, &kv, e))
        return MD_ENOTFOUND;
    if (!kv_int(kv, neg, mag))
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is a %s, expected an integer", key,
                       vtype_name(kv->type));
    return 0;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, md_err *e) {
    int neg = 0, rc;
    uint64_t mag = 0;
    if ((rc = get_int(f, key, &neg, &mag, e)))
        return rc;
    if (neg)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is negative, expected >= 0", key);
    *out = mag;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, md_err *e) {
    int neg = 0, rc;
    uint64_t mag = 0;
    if ((rc = get_int(f, key, &neg, &mag, e)))
        return rc;
    if (!neg && mag > (uint64_t)INT64_MAX)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is %llu, too large for int64", key,
                       (unsigned long long)mag);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, md_err *e) {
    const gguf_kv *kv = NULL;
    int neg;
    uint64_t mag;
    if (find_kv(f, key, &kv, e))
        return MD_ENOTFOUND;
    if (kv->type == GGUF_T_FLOAT32) {
        memcpy(out, kv->val, 4);
        return 0;
    }
    if (kv->type == GGUF_T_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
        return 0;
    }
    if (!kv_int(kv, &neg, &mag))
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is a %s, expected a number", key,
                       vtype_name(kv->type));
    *out = neg ? -(float)mag : (float)mag;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, md_err *e) {
    const gguf_kv *kv = NULL;
    if (find_kv(f, key, &kv, e))
        return MD_ENOTFOUND;
    if (kv->type != GGUF_T_BOOL)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is a %s, expected a bool", key,
                       vtype_name(kv->type));
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len, md_err *e) {
    const gguf_kv *kv = NULL;
    if (find_kv(f, key, &kv, e))
        return MD_ENOTFOUND;
    if (kv->type != GGUF_T_STRING)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is a %s, expected a string", key,
                       vtype_name(kv->type));
    *s = (const char *)kv->val;
    *len = (size_t)kv->len;
    return 0;
}

static int find_arr(const gguf_file *f, const char *key, const gguf_kv **kv, md_err *e) {
    if (find_kv(f, key, kv, e))
        return MD_ENOTFOUND;
    if ((*kv)->type != GGUF_T_ARRAY)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is a %s, expected an array", key,
                       vtype_name((*kv)->type));
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type, uint64_t *n,
                 md_err *e) {
    const gguf_kv *kv = NULL;
    int rc = find_arr(f, key, &kv, e);
    if (rc)
        return rc;
    *elem_type = kv->elem_type;
    *n = kv->n;
    return 0;
}

int gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, const char **s, size_t *len,
                 md_err *e) {
    const gguf_kv *kv = NULL;
    int rc = find_arr(f, key, &kv, e);
    if (rc)
        return rc;
    if (kv->elem_type != GGUF_T_STRING)
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is an array of %s, expected strings", key,
                       vtype_name(kv->elem_type));
    if (i >= kv->n)
        return md_errf(e, MD_ERANGE, "metadata key '%s': index %llu past its %llu elements", key,
                       (unsigned long long)i, (unsigned long long)kv->n);
    uint64_t l;
    memcpy(&l, f->base + kv->str_offs[i], 8);
    *s = (const char *)f->base + kv->str_offs[i] + 8;
    *len = (size_t)l;
    return 0;
}

int gguf_arr_data(const gguf_file *f, const char *key, const void **data, md_err *e) {
    const gguf_kv *kv = NULL;
    int rc = find_arr(f, key, &kv, e);
    if (rc)
        return rc;
    if (!vtype_size(kv->elem_type))
        return md_errf(e, MD_EFORMAT, "metadata key '%s' is an array of %s, expected numbers", key,
                       vtype_name(kv->elem_type));
    *data = kv->val;
    return 0;
}

int64_t gguf_n_tensors(const gguf_file *f) {
    return f->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int64_t lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->t_sorted[mid]].name, name);
        if (c == 0)
            return &f->tensors[f->t_sorted[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}
