/* err.h — medley's error convention.
 *
 * Functions that can fail return an int status: 0 on success, a negative MD_E* code
 * on failure, and fill a caller-provided md_err with one human sentence saying what
 * went wrong and where (file, key, offset, expected vs found). The caller owns the
 * md_err (usually on its stack); nothing here allocates. */
#ifndef MEDLEY_COMMON_ERR_H
#define MEDLEY_COMMON_ERR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MD_OK = 0,
    MD_EINVAL = -1,   /* bad argument or malformed input */
    MD_EIO = -2,      /* file or socket I/O failed */
    MD_ENOMEM = -3,   /* allocation failed or a budget was exceeded */
    MD_EFORMAT = -4,  /* a file or document does not follow its format */
    MD_ENOTFOUND = -5,/* a named thing (model, key, tensor) does not exist */
    MD_EUNSUPP = -6,  /* valid but not supported by this build */
    MD_ERANGE = -7,   /* a value is outside what is allowed (context, size) */
    MD_EREDIS = -8,   /* Redis connection or command failed */
    MD_EDEVICE = -9,  /* a device (GPU) error */
    MD_ECANCEL = -10, /* stopped on request */
};

typedef struct md_err {
    int code;
    char msg[512];
} md_err;

/* Set e (may be NULL) to code and a printf-style message; returns code so callers can
 * write `return md_errf(e, MD_EFORMAT, "...")`. */
int md_errf(md_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int md_verrf(md_err *e, int code, const char *fmt, va_list ap);
/* Prepend context ("loading model x: ") to an existing message. Returns e->code. */
int md_errctx(md_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void md_err_clear(md_err *e);
/* Short name of a code ("format", "io", ...). */
const char *md_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
