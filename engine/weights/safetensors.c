/* safetensors.c — the safetensors reader: mmap, header validation, shard index.
 *
 * Every rule of safetensors.h is checked once, at open, before any pointer into the buffer
 * is formed; the accessors index validated tables. Shards are parsed one after the other into
 * one tensor table, sorted by name at the end (duplicates across shards refused there). */
#include "engine/weights/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dtype.h"

#define ST_MAX_INDEX (64u << 20) /* bytes of model.safetensors.index.json */

typedef struct {
    char *path; /* as opened (or the st_open_mem label) */
    const uint8_t *base;
    size_t size;
    int mapped;
} st_shard;

struct st_file {
    st_shard *shards;
    int n_shards;
    st_tensor *t;
    int64_t n_t, cap_t;
    size_t data_bytes;
};

/* A span of one shard's buffer, for the tiling check. */
typedef struct {
    uint64_t begin, end;
    int64_t idx;
} span;

const char *st_dtype_name(int type) {
    return type == MD_TYPE_F32    ? "F32"
           : type == MD_TYPE_F16  ? "F16"
           : type == MD_TYPE_BF16 ? "BF16"
           : type == MD_TYPE_I64  ? "I64"
                                  : "?";
}

static int dtype_of(const char *s, int *type, size_t *size) {
    if (!strcmp(s, "F32"))
        *type = MD_TYPE_F32, *size = 4;
    else if (!strcmp(s, "F16"))
        *type = MD_TYPE_F16, *size = 2;
    else if (!strcmp(s, "BF16"))
        *type = MD_TYPE_BF16, *size = 2;
    else if (!strcmp(s, "I64")) /* buffers (BERT's position_ids); a weight of it is refused */
        *type = MD_TYPE_I64, *size = 8;
    else
        return -1;
    return 0;
}

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
           : x->end < y->end     ? -1
                                 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* Parse one entry {"dtype", "shape", "data_offsets"} of tensor `name` into t (data still the
 * begin offset, resolved by the caller after the tiling check). */
static int parse_entry(const char *file, const char *name, json_t *v, size_t buf_size, st_tensor *t,
                       span *sp, md_err *e) {
    if (!json_is_object(v))
        return md_errf(e, MD_EFORMAT, "%s: tensor '%s': entry is not a JSON object", file, name);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return md_errf(e, MD_EFORMAT,
                           "%s: tensor '%s': unknown key \"%s\" (dtype, shape, data_offsets are "
                           "expected)",
                           file, name, key);
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *of = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return md_errf(e, MD_EFORMAT, "%s: tensor '%s': \"dtype\" is missing or not a string", file,
                       name);
    size_t esz;
    if (dtype_of(json_string_value(dt), &t->type, &esz))
        return md_errf(e, MD_EUNSUPP,
                       "%s: tensor '%s': dtype %.32s is not supported (F32, F16, BF16, I64 are)", file,
                       name, json_string_value(dt));
    if (!json_is_array(sh) || json_array_size(sh) > ST_MAX_DIMS)
        return md_errf(e, MD_EFORMAT,
                       "%s: tensor '%s': \"shape\" is missing, not an array, or has more than %d "
                       "dimensions",
                       file, name, ST_MAX_DIMS);
    t->n_dims = (int)json_array_size(sh);
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) {
        json_t *dv = json_array_get(sh, (size_t)d);
        json_int_t k = json_is_integer(dv) ? json_integer_value(dv) : -1;
        if (k < 0)
            return md_errf(e, MD_EFORMAT,
                           "%s: tensor '%s': shape dimension %d is not a non-negative integer",
                           file, name, d);
        if (k && n > (uint64_t)INT64_MAX / (uint64_t)k / esz)
            return md_errf(e, MD_EFORMAT, "%s: tensor '%s': shape overflows a 64-bit byte count",
                           file, name);
        t->shape[d] = (int64_t)k;
        n *= (uint64_t)k;
    }
    t->n_elements = (int64_t)n;
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(json_array_get(of, 0)) ||
        !json_is_integer(json_array_get(of, 1)))
        return md_errf(e, MD_EFORMAT,
                       "%s: tensor '%s': \"data_offsets\" is not an array of two integers", file,
                       name);
    json_int_t b = json_integer_value(json_array_get(of, 0)),
               en = json_integer_value(json_array_get(of, 1));
    if (b < 0 || en < b)
        return md_errf(e, MD_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are not a span",
                       file, name, (long long)b, (long long)en);
    if ((uint64_t)en > buf_size)
        return md_errf(e, MD_EFORMAT,
                       "%s: tensor '%s': data_offsets end %lld is past the end of the %zu-byte "
                       "buffer (truncated file?)",
                       file, name, (long long)en, buf_size);
    if ((uint64_t)(en - b) != n * esz)
        return md_errf(e, MD_EFORMAT,
                       "%s: tensor '%s': %llu elements of %s take %llu bytes but data_offsets "
                       "span %lld",
                       file, name, (unsigned long long)n, st_dtype_name(t->type),
                       (unsigned long long)(n * esz), (long long)(en - b));
    t->n_bytes = (size_t)(en - b);
    sp->begin = (uint64_t)b;
    sp->end = (uint64_t)en;
    return 0;
}

static int push_tensor(st_file *f, md_err *e) {
    if (f->n_t < f->cap_t)
        return 0;
    int64_t nc = f->cap_t ? f->cap_t * 2 : 64;
    st_tensor *p = realloc(f->t, (size_t)nc * sizeof *p);
    if (!p)
        return md_errf(e, MD_ENOMEM, "out of memory for %lld tensor entries", (long long)nc);
    f->t = p;
    f->cap_t = nc;
    return 0;
}

/* Validate shard si (already mapped) and append its tensors to f->t. */
static int parse_shard(st_file *f, int si, md_err *e) {
    const st_shard *s = &f->shards[si];
    const char *file = s->path;
    if (s->size < 8)
        return md_errf(e, MD_EFORMAT,
                       "%s: %zu bytes is too short for a safetensors file (8-byte header length "
                       "first)",
                       file, s->size);
    uint64_t hlen;
    memcpy(&hlen, s->base, 8);
    if (hlen < 2 || hlen > ST_MAX_HEADER)
        return md_errf(e, MD_EFORMAT,
                       "%s: header length %llu is outside 2..%u bytes (not a safetensors file?)",
                       file, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > s->size - 8)
        return md_errf(e, MD_EFORMAT,
                       "%s: truncated: the header claims %llu bytes but only %zu follow", file,
                       (unsigned long long)hlen, s->size - 8);
    size_t data_at = 8 + (size_t)hlen, buf_size = s->size - data_at;
    json_error_t je;
    json_t *h = json_loadb((const char *)s->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!h)
        return md_errf(e, MD_EFORMAT, "%s: header is not valid JSON at byte %d: %s", file,
                       je.position, je.text);
    int rc = 0;
    span *sp = NULL;
    if (!json_is_object(h)) {
        rc = md_errf(e, MD_EFORMAT, "%s: header is not a JSON object", file);
        goto out;
    }
    sp = malloc((json_object_size(h) + 1) * sizeof *sp);
    if (!sp) {
        rc = md_errf(e, MD_ENOMEM, "%s: out of memory for %zu header entries", file,
                     json_object_size(h));
        goto out;
    }
    int64_t first = f->n_t, ns = 0;
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) {
        if (!strcmp(name, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                rc = md_errf(e, MD_EFORMAT, "%s: __metadata__ is not a JSON object", file);
                goto out;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = md_errf(e, MD_EFORMAT, "%s: __metadata__ value \"%.64s\" is not a string",
                                 file, mk);
                    goto out;
                }
            }
            continue;
        }
        size_t nlen = strlen(name);
        if (nlen == 0 || nlen > ST_MAX_NAME) {
            rc = md_errf(e, MD_EFORMAT, "%s: a tensor name of %zu bytes is outside 1..%d", file,
                         nlen, ST_MAX_NAME);
            goto out;
        }
        if ((rc = push_tensor(f, e)))
            goto out;
        st_tensor *t = &f->t[f->n_t];
        memset(t, 0, sizeof *t);
        if ((rc = parse_entry(file, name, v, buf_size, t, &sp[ns], e)))
            goto out;
        size_t esz = md_type_block_bytes(t->type);
        if ((data_at + sp[ns].begin) % esz) {
            rc = md_errf(e, MD_EFORMAT,
                         "%s: tensor '%s': its data at file offset %llu is not aligned to its "
                         "%zu-byte elements",
                         file, name, (unsigned long long)(data_at + sp[ns].begin), esz);
            goto out;
        }
        if (!(t->name = strdup(name))) {
            rc = md_errf(e, MD_ENOMEM, "out of memory");
            goto out;
        }
        t->shard = si;
        t->data = s->base + data_at + sp[ns].begin;
        sp[ns].idx = f->n_t;
        f->n_t++;
        ns++;
    }
    /* The buffer must be tiled: spans in offset order, each starting where the last ended,
     * the last ending at the end of the file. */
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (int64_t i = 0; i < ns; i++) {
        const char *tn = f->t[sp[i].idx].name;
        if (sp[i].begin < at) {
            rc = md_errf(e, MD_EFORMAT, "%s: tensors '%s' and '%s' overlap in the byte buffer",
                         file, f->t[sp[i - 1].idx].name, tn);
            goto out;
        }
        if (sp[i].begin > at) {
            rc = md_errf(e, MD_EFORMAT,
                         "%s: %llu bytes before tensor '%s' (buffer offset %llu) belong to no "
                         "tensor",
                         file, (unsigned long long)(sp[i].begin - at), tn, (unsigned long long)at);
            goto out;
        }
        at = sp[i].end;
    }
    if (at != buf_size) {
        rc = md_errf(e, MD_EFORMAT,
                     "%s: the tensors cover %llu bytes of the %zu-byte buffer (the rest belongs "
                     "to no tensor)",
                     file, (unsigned long long)at, buf_size);
        goto out;
    }
    for (int64_t i = first; i < f->n_t; i++)
        f->data_bytes += f->t[i].n_bytes;
out:
    free(sp);
    json_decref(h);
    return rc;
}

/* Sort by name and refuse a name seen twice (only possible across shards). */
static int finish(st_file *f, md_err *e) {
    if (f->n_t > 1)
        qsort(f->t, (size_t)f->n_t, sizeof *f->t, cmp_name);
    for (int64_t i = 1; i < f->n_t; i++)
        if (!strcmp(f->t[i].name, f->t[i - 1].name))
            return md_errf(e, MD_EFORMAT, "tensor '%s' is in both %s and %s", f->t[i].name,
                           f->shards[f->t[i - 1].shard].path, f->shards[f->t[i].shard].path);
    return 0;
}

void st_close(st_file *f) {
    if (!f)
        return;
    for (int i = 0; i < f->n_shards; i++) {
        if (f->shards[i].mapped && f->shards[i].base)
            munmap((void *)f->shards[i].base, f->shards[i].size);
        free(f->shards[i].path);
    }
    for (int64_t i = 0; i < f->n_t; i++)
        free((char *)f->t[i].name);
    free(f->shards);
    free(f->t);
    free(f);
}

/* Add a shard (mapping path, or borrowing buf when path is NULL) and parse it. */
static int add_shard(st_file *f, const char *path, const void *buf, size_t len, const char *label,
                     md_err *e) {
    st_shard *ns = realloc(f->shards, (size_t)(f->n_shards + 1) * sizeof *ns);
    if (!ns)
        return md_errf(e, MD_ENOMEM, "out of memory");
    f->shards = ns;
    st_shard *s = &f->shards[f->n_shards];
    memset(s, 0, sizeof *s);
    if (!(s->path = strdup(path ? path : label ? label : "(memory)")))
        return md_errf(e, MD_ENOMEM, "out of memory");
    f->n_shards++;
    if (!path) {
        s->base = buf;
        s->size = len;
        return parse_shard(f, f->n_shards - 1, e);
    }
    /* O_NONBLOCK: a FIFO's open would wait for a writer; fstat below refuses it instead */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return md_errf(e, errno == ENOENT ? MD_ENOTFOUND : MD_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return md_errf(e, MD_EIO, "%s: not a regular file", path);
    }
    s->size = (size_t)st.st_size;
    if (s->size >= 8) {
        void *p = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return md_errf(e, MD_EIO, "%s: mmap of %zu bytes: %s", path, s->size, strerror(err));
        }
        s->base = p;
        s->mapped = 1;
    }
    close(fd);
    return parse_shard(f, f->n_shards - 1, e);
}

static int open_common(const char *path, const void *buf, size_t len, const char *label,
                       st_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "out of memory");
    int rc = add_shard(f, path, buf, len, label, e);
    if (!rc)
        rc = finish(f, e);
    if (rc) {
        st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int st_open(const char *path, st_file **out, md_err *e) {
    return open_common(path, NULL, 0, NULL, out, e);
}

int st_open_mem(const void *buf, size_t len, const char *label, st_file **out, md_err *e) {
    if (!buf && len)
        return md_errf(e, MD_EINVAL, "st_open_mem: NULL buffer");
    return open_common(NULL, buf ? buf : "", len, label, out, e);
}

/* A shard name of the index: a plain file name in the directory. */
static int shard_name_ok(const char *s) {
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && strlen(s) < 512;
}

static int open_index(const char *dir, const char *ipath, st_file *f, md_err *e) {
    json_error_t je;
    json_t *ix = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (!ix)
        return md_errf(e, MD_EFORMAT, "%s: not valid JSON (line %d: %s)", ipath, je.line, je.text);
    int rc = 0;
    json_t *wm = json_object_get(ix, "weight_map");
    if (!json_is_object(ix) || !json_is_object(wm) || json_object_size(wm) == 0) {
        rc = md_errf(e, MD_EFORMAT, "%s: no \"weight_map\" object naming the shards", ipath);
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        const char *sn = json_string_value(v);
        if (!sn || !shard_name_ok(sn)) {
            rc = md_errf(e, MD_EFORMAT,
                         "%s: weight_map[\"%.128s\"] is not a file name in the directory", ipath,
                         name);
            goto out;
        }
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, sn);
        int have = 0;
        for (int i = 0; i < f->n_shards && !have; i++)
            have = !strcmp(f->shards[i].path, p);
        if (have)
            continue;
        if (f->n_shards >= ST_MAX_SHARDS) {
            rc = md_errf(e, MD_EFORMAT, "%s: more than %d shards", ipath, ST_MAX_SHARDS);
            goto out;
        }
        if ((rc = add_shard(f, p, NULL, 0, NULL, e)))
            goto out;
    }
    /* Every mapped tensor in its shard, and every tensor of a shard in the map. */
    if ((rc = finish(f, e)))
        goto out;
    json_object_foreach(wm, name, v) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, json_string_value(v));
        const st_tensor *t = st_find(f, name);
        if (!t || strcmp(f->shards[t->shard].path, p)) {
            rc = md_errf(e, MD_EFORMAT, "%s: tensor '%.256s' is mapped to %s, which lacks it",
                         ipath, name, json_string_value(v));
            goto out;
        }
    }
    if ((int64_t)json_object_size(wm) != f->n_t)
        rc = md_errf(e, MD_EFORMAT, "%s: the shards hold %lld tensors but weight_map lists %zu",
                     ipath, (long long)f->n_t, json_object_size(wm));
out:
    json_decref(ix);
    return rc;
}

int st_open_dir(const char *dir, st_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    char ipath[4096], spath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    snprintf(spath, sizeof spath, "%s/model.safetensors", dir);
    struct stat st;
    if (stat(ipath, &st) != 0) {
        if (stat(spath, &st) != 0)
            return md_errf(e, MD_ENOTFOUND,
                           "%s: neither model.safetensors nor model.safetensors.index.json is "
                           "there",
                           dir);
        return st_open(spath, out, e);
    }
    if (!S_ISREG(st.st_mode)) /* a FIFO would block json_load_file forever */
        return md_errf(e, MD_EIO, "%s: not a regular file", ipath);
    if (st.st_size > (off_t)ST_MAX_INDEX)
        return md_errf(e, MD_EFORMAT, "%s: %lld bytes is too large for a shard index", ipath,
                       (long long)st.st_size);
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "out of memory");
    int rc = open_index(dir, ipath, f, e);
    if (rc) {
        st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int64_t st_n_tensors(const st_file *f) {
    return f->n_t;
}

const st_tensor *st_tensor_at(const st_file *f, int64_t i) {
    return i >= 0 && i < f->n_t ? &f->t[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    int64_t lo = 0, hi = f->n_t;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[mid].name, name);
        if (c == 0)
            return &f->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int st_n_shards(const st_file *f) {
    return f->n_shards;
}

const char *st_shard_path(const st_file *f, int i) {
    return i >= 0 && i < f->n_shards ? f->shards[i].path : NULL;
}

size_t st_data_bytes(const st_file *f) {
    return f->data_bytes;
}
