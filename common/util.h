/* util.h — small helpers every part needs: clocks, random ids, whole-file reads,
 * the cache directory, JSON field access with errors that name the field, and the host's
 * memory. */
#ifndef MEDLEY_COMMON_UTIL_H
#define MEDLEY_COMMON_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Monotonic clock in nanoseconds (for durations). */
uint64_t md_mono_ns(void);
/* Wall clock in milliseconds since the Unix epoch (for timestamps in documents). */
int64_t md_wall_ms(void);
/* Wall clock in seconds since the epoch, as a double. */
double md_wall_s(void);

/* Fill out with a random id of n hex chars (n < outsz); from getrandom(2). */
void md_random_hex(char *out, size_t outsz, size_t n);

/* Read a whole file; *data is malloc'd (NUL-terminated, caller frees), *len its size
 * without the NUL. max_bytes bounds the read (0 = no bound). */
int md_read_file(const char *path, size_t max_bytes, char **data, size_t *len, md_err *e);

/* medley's cache directory: $MEDLEY_CACHE, else $XDG_CACHE_HOME/medley, else
 * ~/.cache/medley. Created if missing. Writes into out (PATH_MAX). */
int md_cache_dir(char *out, size_t outsz, md_err *e);
/* mkdir -p. */
int md_mkdirs(const char *path, md_err *e);

/* Parse a JSON document from a file, with the parse error's line/column in e. Caller
 * owns the returned reference (json_decref). */
json_t *md_json_load(const char *path, md_err *e);
/* Typed getters: return 0 and set *out, or MD_EINVAL naming `where`.`key`. When the key
 * is absent and `required` is 0, *out is left unchanged and 0 is returned. */
int md_json_get_str(json_t *obj, const char *key, int required, const char **out, const char *where,
                    md_err *e);
int md_json_get_int(json_t *obj, const char *key, int required, long long *out, const char *where,
                    md_err *e);
int md_json_get_num(json_t *obj, const char *key, int required, double *out, const char *where,
                    md_err *e);
int md_json_get_bool(json_t *obj, const char *key, int required, int *out, const char *where,
                     md_err *e);
/* MD_EINVAL naming `where` and the key when obj (an object) has a key not in known (a
 * NULL-terminated list, as the document's schema lists them: the schemas forbid unknown
 * keys, so a misspelled one is an error, not a silent default). 0 for a non-object. */
int md_json_check_keys(json_t *obj, const char *const *known, const char *where, md_err *e);
/* A JSON value's type for messages, with its article: "an object", "a string", "null". */
const char *md_json_type_name(const json_t *v);

/* "123", "64k", "512M", "2G" (powers of 1024) into bytes; -1 for anything else. */
long long md_parse_size(const char *s);

/* The memory this host gives a process, bytes: /proc/meminfo's MemTotal, or the cgroup's
 * limit when lower (cgroup v2 memory.max, v1 memory.limit_in_bytes: a container's). root:
 * where / is ("/" when NULL; tests pass a folder of such files). 0 when MemTotal cannot be
 * read. */
long long md_host_memory_bytes(const char *root);

#endif
