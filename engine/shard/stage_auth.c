/* stage_auth.c — the stage link's secret and the HMAC-SHA256 of its handshake. See
 * stage_auth.h. */
#include "engine/shard/stage_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

int md_stage_secret_load(const char *path, md_stage_secret *s, md_err *e) {
    md_stage_secret_clear(s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return md_errf(e, MD_EIO, "stage secret file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 007))
        MD_WARN("stage", "stage secret file %s is open to every user (mode %03o): chmod 600 it",
                path, (unsigned)(st.st_mode & 0777));
    uint8_t buf[MD_STAGE_SECRET_MAX + 64];
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, sizeof buf - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int err = errno;
            close(fd);
            OPENSSL_cleanse(buf, sizeof buf);
            return md_errf(e, MD_EIO, "stage secret file %s: %s", path, strerror(err));
        }
        if (k == 0 || (n += (size_t)k) == sizeof buf)
            break;
    }
    close(fd);
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    int rc = 0;
    if (n < MD_STAGE_SECRET_MIN || n > MD_STAGE_SECRET_MAX)
        rc = md_errf(e, MD_EINVAL,
                     "stage secret file %s holds %s%zu bytes; a secret is %d to %d bytes (e.g. "
                     "`head -c 32 /dev/urandom | base64 > FILE`)",
                     path, n == sizeof buf ? "at least " : "", n, MD_STAGE_SECRET_MIN,
                     MD_STAGE_SECRET_MAX);
    else {
        memcpy(s->key, buf, n);
        s->len = n;
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return rc;
}

int md_stage_secret_from(const char *path, const char *who, md_stage_secret *s, md_err *e) {
    if (!path || !*path)
        path = getenv(MD_STAGE_SECRET_ENV);
    if (!path || !*path)
        return md_errf(e, MD_ENOTFOUND,
                       "%s needs the stage secret: a file given by --%s or by $%s "
                       "(docs/sharding.md \"Authentication\")",
                       who, strncmp(who, "medley stage", 12) ? "stage-secret-file" : "secret-file",
                       MD_STAGE_SECRET_ENV);
    return md_stage_secret_load(path, s, e);
}

void md_stage_secret_clear(md_stage_secret *s) {
    OPENSSL_cleanse(s, sizeof *s);
}

int md_stage_nonce(uint8_t out[MD_STAGE_NONCE], md_err *e) {
    size_t n = 0;
    while (n < MD_STAGE_NONCE) {
        ssize_t k = getrandom(out + n, MD_STAGE_NONCE - n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return md_errf(e, MD_EIO, "no random bytes for a nonce: %s", strerror(errno));
        n += (size_t)k;
    }
    return 0;
}

int md_stage_mac(const md_stage_secret *s, const char *label, const uint8_t *a, const uint8_t *b,
                 const uint8_t *msg, size_t n, uint8_t out[MD_STAGE_MAC]) {
    /* label | a | b | msg is hashed in one call over a copy: HELLO and READY are small
     * (MD_WIRE_SMALL_MAX), and the one-shot HMAC() is the API OpenSSL 3 keeps undeprecated. */
    size_t ll = strlen(label), m = ll + MD_STAGE_NONCE * (b ? 2 : 1) + n;
    uint8_t *buf = malloc(m ? m : 1);
    unsigned len = MD_STAGE_MAC;
    if (!buf)
        return -1;
    memcpy(buf, label, ll);
    memcpy(buf + ll, a, MD_STAGE_NONCE);
    if (b)
        memcpy(buf + ll + MD_STAGE_NONCE, b, MD_STAGE_NONCE);
    if (n)
        memcpy(buf + ll + MD_STAGE_NONCE * (b ? 2 : 1), msg, n);
    int ok = s->len > 0 && HMAC(EVP_sha256(), s->key, (int)s->len, buf, m, out, &len) != NULL;
    free(buf);
    return ok ? 0 : -1;
}

int md_stage_mac_equal(const uint8_t *x, const uint8_t *y) {
    return CRYPTO_memcmp(x, y, MD_STAGE_MAC) == 0;
}
