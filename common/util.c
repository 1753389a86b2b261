/* util.c — see util.h. */
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

uint64_t md_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t md_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double md_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void md_random_hex(char *out, size_t outsz, size_t n) {
    static const char hex[] = "0123456789abcdef";
    unsigned char buf[64];
    if (n >= outsz)
        n = outsz - 1;
    if (n > 2 * sizeof buf)
        n = 2 * sizeof buf;
    size_t need = (n + 1) / 2, got = 0;
    while (got < need) {
        ssize_t r = getrandom(buf + got, need - got, 0);
        if (r <= 0) { /* fall back to a time-seeded LCG; ids need uniqueness, not secrecy */
            uint64_t x = md_mono_ns() ^ (uint64_t)md_wall_ms() << 20;
            for (; got < need; got++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                buf[got] = (unsigned char)(x >> 56);
            }
            break;
        }
        got += (size_t)r;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = hex[(buf[i / 2] >> ((i & 1) ? 0 : 4)) & 15];
    out[n] = '\0';
}

int md_read_file(const char *path, size_t max_bytes, char **data, size_t *len, md_err *e) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return md_errf(e, MD_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return md_errf(e, MD_ENOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        if (n == cap) {
            if (max_bytes && cap >= max_bytes) {
                free(buf);
                fclose(f);
                return md_errf(e, MD_ERANGE, "%s is larger than the %zu bytes allowed", path,
                               max_bytes);
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return md_errf(e, MD_ENOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return md_errf(e, MD_EIO, "error reading %s", path);
    }
    if (max_bytes && n > max_bytes) {
        free(buf);
        return md_errf(e, MD_ERANGE, "%s is larger than the %zu bytes allowed", path, max_bytes);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

int md_mkdirs(const char *path, md_err *e) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return md_errf(e, MD_ERANGE, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return md_errf(e, MD_EIO, "cannot create %s: %s", tmp, strerror(errno));
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return md_errf(e, MD_EIO, "cannot create %s: %s", tmp, strerror(errno));
    return 0;
}

int md_cache_dir(char *out, size_t outsz, md_err *e) {
    const char *m = getenv("MEDLEY_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (m && *m)
        n = snprintf(out, outsz, "%s", m);
    else if (x && *x)
        n = snprintf(out, outsz, "%s/medley", x);
    else if (h && *h)
        n = snprintf(out, outsz, "%s/.cache/medley", h);
    else
        return md_errf(e, MD_ENOTFOUND, "no cache directory: set MEDLEY_CACHE or HOME");
    if (n < 0 || (size_t)n >= outsz)
        return md_errf(e, MD_ERANGE, "cache directory path too long");
    return md_mkdirs(out, e);
}

json_t *md_json_load(const char *path, md_err *e) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        md_errf(e, MD_EFORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    return j;
}

static json_t *get_field(json_t *obj, const char *key, int required, const char *where, int *rc,
                         md_err *e) {
    *rc = 0;
    if (!json_is_object(obj)) {
        *rc = md_errf(e, MD_EINVAL, "%s is not a JSON object", where);
        return NULL;
    }
    json_t *v = json_object_get(obj, key);
    if ((!v || json_is_null(v)) && required)
        *rc = md_errf(e, MD_EINVAL, "%s.%s is required", where, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

int md_json_get_str(json_t *obj, const char *key, int required, const char **out, const char *where,
                    md_err *e) {
    int rc;
    json_t *v = get_field(obj, key, required, where, &rc, e);
    if (!v)
        return rc;
    if (!json_is_string(v))
        return md_errf(e, MD_EINVAL, "%s.%s must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

int md_json_get_int(json_t *obj, const char *key, int required, long long *out, const char *where,
                    md_err *e) {
    int rc;
    json_t *v = get_field(obj, key, required, where, &rc, e);
    if (!v)
        return rc;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == (double)(long long)d) {
            *out = (long long)d;
            return 0;
        }
    }
    return md_errf(e, MD_EINVAL, "%s.%s must be an integer", where, key);
}

int md_json_get_num(json_t *obj, const char *key, int required, double *out, const char *where,
                    md_err *e) {
    int rc;
    json_t *v = get_field(obj, key, required, where, &rc, e);
    if (!v)
        return rc;
    if (!json_is_number(v))
        return md_errf(e, MD_EINVAL, "%s.%s must be a number", where, key);
    *out = json_number_value(v);
    return 0;
}

int md_json_get_bool(json_t *obj, const char *key, int required, int *out, const char *where,
                     md_err *e) {
    int rc;
    json_t *v = get_field(obj, key, required, where, &rc, e);
    if (!v)
        return rc;
    if (!json_is_boolean(v))
        return md_errf(e, MD_EINVAL, "%s.%s must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

int md_json_check_keys(json_t *obj, const char *const *known, const char *where, md_err *e) {
    if (!json_is_object(obj))
        return 0;
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(k, known[i]);
        if (ok)
            continue;
        char list[512] = "";
        size_t n = 0;
        for (int i = 0; known[i] && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", known[i]);
        return md_errf(e, MD_EINVAL, "%s: unknown key '%.80s' (known: %s)", where, k, list);
    }
    return 0;
}

const char *md_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

long long md_parse_size(const char *s) {
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1048576.0;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1073741824.0;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1099511627776.0;
        end++;
        break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end += *end == 'i' ? (end[1] == 'B' ? 2 : 1) : 1;
    if (*end || v * mul > 9e18)
        return -1;
    return (long long)(v * mul);
}

/* The first number after `key` in the file root/rel (its first 64 KiB), times unit; -1 when
 * the file or the key is missing or no number follows ("max": no limit). */
static long long number_in(const char *root, const char *rel, const char *key, long long unit) {
    char path[4096], buf[65536];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = key[0] ? strstr(buf, key) : buf;
    if (!p)
        return -1;
    p += strlen(key);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    errno = 0;
    long long v = strtoll(p, NULL, 10);
    return errno || v > LLONG_MAX / unit ? -1 : v * unit;
}

long long md_host_memory_bytes(const char *root) {
    if (!root)
        root = "/";
    long long total = number_in(root, "proc/meminfo", "MemTotal:", 1024);
    if (total <= 0)
        return 0;
    long long v2 = number_in(root, "sys/fs/cgroup/memory.max", "", 1),
              v1 = number_in(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "", 1);
    if (v2 > 0 && v2 < total)
        total = v2;
    if (v1 > 0 && v1 < total) /* v1 says "no limit" with a huge number: above MemTotal */
        total = v1;
    return total;
}
