/* err.c — filling md_err. See err.h. */
#include "common/err.h"

#include <stdio.h>
#include <string.h>

int md_verrf(md_err *e, int code, const char *fmt, va_list ap) {
    if (e) {
        e->code = code;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    }
    return code;
}

int md_errf(md_err *e, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    md_verrf(e, code, fmt, ap);
    va_end(ap);
    return code;
}

int md_errctx(md_err *e, const char *fmt, ...) {
    if (!e)
        return MD_EINVAL;
    char prefix[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s%s", prefix, old);
    return e->code;
}

void md_err_clear(md_err *e) {
    if (e) {
        e->code = 0;
        e->msg[0] = '\0';
    }
}

const char *md_strerror(int code) {
    switch (code) {
    case MD_OK: return "ok";
    case MD_EINVAL: return "invalid";
    case MD_EIO: return "io";
    case MD_ENOMEM: return "nomem";
    case MD_EFORMAT: return "format";
    case MD_ENOTFOUND: return "notfound";
    case MD_EUNSUPP: return "unsupported";
    case MD_ERANGE: return "range";
    case MD_EREDIS: return "redis";
    case MD_EDEVICE: return "device";
    case MD_ECANCEL: return "cancelled";
    default: return "error";
    }
}
