/* keys.c — the API key file: one `TENANT KEY` pair a line, `#` comments, a key given as
 * `sha256:HEX` (64 hex digits of the key's SHA-256) so that the file need not hold secrets.
 * Matching compares every entry in constant time per entry (OpenSSL's CRYPTO_memcmp). */
#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

#define KEY_MAX 256

typedef struct {
    char tenant[API_TENANT_MAX];
    unsigned char digest[32]; /* SHA-256 of the key: plain keys are hashed on load */
} key_entry;

struct api_keys {
    key_entry *v;
    size_t n;
};

static void sha256(const char *s, size_t n, unsigned char out[32]) {
    unsigned int len = 32;
    EVP_Digest(s, n, out, &len, EVP_sha256(), NULL);
}

static int hexval(int c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int tenant_ok(const char *t) {
    size_t n = strlen(t);
    if (!n || n >= API_TENANT_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && !strchr("_.-", t[i]))
            return 0;
    return 1;
}

/* One line "TENANT KEY" into ent; 0, or MD_EINVAL naming the line. */
static int parse_line(const char *path, int lineno, char *line, key_entry *ent, md_err *e) {
    char *save = NULL;
    char *t = strtok_r(line, " \t\r\n", &save), *k = strtok_r(NULL, " \t\r\n", &save);
    if (!t || !k || strtok_r(NULL, " \t\r\n", &save))
        return md_errf(e, MD_EINVAL, "%s:%d: expected `TENANT KEY`", path, lineno);
    if (!tenant_ok(t))
        return md_errf(e, MD_EINVAL,
                       "%s:%d: tenant '%.80s' must be 1..%d chars of letters, digits, _ . -", path,
                       lineno, t, API_TENANT_MAX - 1);
    snprintf(ent->tenant, sizeof ent->tenant, "%s", t);
    if (!strncmp(k, "sha256:", 7)) {
        const char *h = k + 7;
        if (strlen(h) != 64)
            return md_errf(e, MD_EINVAL, "%s:%d: sha256: needs 64 hex digits", path, lineno);
        for (int i = 0; i < 32; i++) {
            int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
            if (a < 0 || b < 0)
                return md_errf(e, MD_EINVAL, "%s:%d: sha256: needs 64 hex digits", path, lineno);
            ent->digest[i] = (unsigned char)(a * 16 + b);
        }
        return 0;
    }
    if (strlen(k) < 16 || strlen(k) >= KEY_MAX)
        return md_errf(e, MD_EINVAL, "%s:%d: a key must be 16..%d bytes", path, lineno,
                       KEY_MAX - 1);
    sha256(k, strlen(k), ent->digest);
    return 0;
}

int api_keys_load(const char *path, api_keys **out, md_err *e) {
    FILE *f = fopen(path, "r");
    if (!f)
        return md_errf(e, MD_EIO, "API key file %s: %s", path, strerror(errno));
    api_keys *k = calloc(1, sizeof *k);
    char line[1024];
    int lineno = 0, rc = k ? 0 : md_errf(e, MD_ENOMEM, "out of memory");
    size_t cap = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p || *p == '#')
            continue;
        if (k->n == cap) {
            cap = cap ? cap * 2 : 16;
            key_entry *nv = realloc(k->v, cap * sizeof *nv);
            if (!nv) {
                rc = md_errf(e, MD_ENOMEM, "out of memory");
                break;
            }
            k->v = nv;
        }
        if (!(rc = parse_line(path, lineno, p, &k->v[k->n], e)))
            k->n++;
    }
    fclose(f);
    if (!rc && k->n == 0)
        rc = md_errf(e, MD_EINVAL, "API key file %s holds no `TENANT KEY` line", path);
    if (rc) {
        api_keys_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void api_keys_free(api_keys *k) {
    if (!k)
        return;
    OPENSSL_cleanse(k->v, k->n * sizeof *k->v);
    free(k->v);
    free(k);
}

const char *api_keys_tenant(const api_keys *k, const char *authorization) {
    if (!k || !authorization || strncasecmp(authorization, "Bearer ", 7))
        return NULL;
    const char *given = authorization + 7;
    size_t n = strlen(given);
    if (!n || n >= KEY_MAX)
        return NULL;
    unsigned char d[32];
    sha256(given, n, d);
    const char *found = NULL;
    for (size_t i = 0; i < k->n; i++)
        if (!CRYPTO_memcmp(d, k->v[i].digest, 32) && !found)
            found = k->v[i].tenant;
    return found;
}
