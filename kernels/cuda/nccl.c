/* nccl.c — collectives between GPUs for the CUDA backend (cuda_ops.h "collectives", backend.h
 * comm_* ops): NCCL communicators, all-reduce and send/recv queued on a ctx's stream.
 *
 * Built when CMake found nccl.h next to the toolkit (MEDLEY_HAVE_NCCL), so every call is
 * compiled against NCCL's own declarations. The library is opened at the first call (dlopen)
 * rather than linked: every GPU binary links medley_cuda, a single GPU needs no NCCL, and
 * libnccl (200+ MB) is more than the device check's pack can carry; where it is absent the
 * calls fail with MD_EUNSUPP saying so. Looked for as $MEDLEY_NCCL_LIBRARY, then libnccl.so.2
 * on the loader's path, then the library CMake found (MEDLEY_NCCL_LIBRARY_PATH).
 *
 * A communicator keeps its first error, as a ctx keeps its device error: a rank that skipped
 * a collective leaves its peers waiting for it, so no later call may run as if the ranks were
 * still in step. cuda_comm_free aborts a failed communicator (ncclCommAbort ends its kernels
 * still waiting for peers) and destroys a sound one. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"

_Static_assert(sizeof(ncclUniqueId) == CUDA_COMM_ID_BYTES, "cuda_ops.h's id is NCCL's");

#ifndef MEDLEY_NCCL_LIBRARY_PATH
#define MEDLEY_NCCL_LIBRARY_PATH ""
#endif
#define NCCL_MIN_VERSION 21300 /* 2.13: ncclGetLastError */

struct md_comm {
    ncclComm_t comm;
    int ordinal, rank, n;
    md_err failed; /* code != 0 after the first error */
};

/* The library's entry points medley calls, typed by nccl.h, resolved once. */
static struct {
    void *lib;
    char why[480]; /* why it is not loaded */
    __typeof__(ncclGetVersion) *get_version;
    __typeof__(ncclGetUniqueId) *get_unique_id;
    __typeof__(ncclCommInitRank) *comm_init_rank;
    __typeof__(ncclCommDestroy) *comm_destroy;
    __typeof__(ncclCommAbort) *comm_abort;
    __typeof__(ncclCommGetAsyncError) *comm_get_async_error;
    __typeof__(ncclAllReduce) *all_reduce;
    __typeof__(ncclSend) *send;
    __typeof__(ncclRecv) *recv;
    __typeof__(ncclGroupStart) *group_start;
    __typeof__(ncclGroupEnd) *group_end;
    __typeof__(ncclGetErrorString) *get_error_string;
    __typeof__(ncclGetLastError) *get_last_error;
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

/* dlsym(name), noting the first missing one in nc.why. */
static void *nc_sym(const char *path, const char *name) {
    void *p = dlsym(nc.lib, name);
    if (!p && !nc.why[0])
        snprintf(nc.why, sizeof nc.why, "NCCL at %s has no %s", path, name);
    return p;
}

static void nc_load(void) {
    const char *env = getenv("MEDLEY_NCCL_LIBRARY");
    const char *tries[] = {env && *env ? env : NULL, "libnccl.so.2", MEDLEY_NCCL_LIBRARY_PATH};
    const char *path = NULL;
    char err[256] = "not found";
    for (size_t i = 0; i < sizeof tries / sizeof tries[0] && !nc.lib; i++) {
        if (!tries[i] || !*tries[i])
            continue;
        if ((nc.lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL)))
            path = tries[i];
        else
            snprintf(err, sizeof err, "%s", dlerror());
    }
    if (!nc.lib) {
        snprintf(nc.why, sizeof nc.why,
                 "NCCL cannot be loaded (%s); install libnccl2 or set MEDLEY_NCCL_LIBRARY to "
                 "libnccl.so.2",
                 err);
        return;
    }
    nc.why[0] = 0;
    nc.get_version = (__typeof__(nc.get_version))nc_sym(path, "ncclGetVersion");
    nc.get_unique_id = (__typeof__(nc.get_unique_id))nc_sym(path, "ncclGetUniqueId");
    nc.comm_init_rank = (__typeof__(nc.comm_init_rank))nc_sym(path, "ncclCommInitRank");
    nc.comm_destroy = (__typeof__(nc.comm_destroy))nc_sym(path, "ncclCommDestroy");
    nc.comm_abort = (__typeof__(nc.comm_abort))nc_sym(path, "ncclCommAbort");
    nc.comm_get_async_error =
        (__typeof__(nc.comm_get_async_error))nc_sym(path, "ncclCommGetAsyncError");
    nc.all_reduce = (__typeof__(nc.all_reduce))nc_sym(path, "ncclAllReduce");
    nc.send = (__typeof__(nc.send))nc_sym(path, "ncclSend");
    nc.recv = (__typeof__(nc.recv))nc_sym(path, "ncclRecv");
    nc.group_start = (__typeof__(nc.group_start))nc_sym(path, "ncclGroupStart");
    nc.group_end = (__typeof__(nc.group_end))nc_sym(path, "ncclGroupEnd");
    nc.get_error_string = (__typeof__(nc.get_error_string))nc_sym(path, "ncclGetErrorString");
    nc.get_last_error = (__typeof__(nc.get_last_error))nc_sym(path, "ncclGetLastError");
    int v = 0;
    if (!nc.why[0] && (nc.get_version(&v) != ncclSuccess || v < NCCL_MIN_VERSION))
        snprintf(nc.why, sizeof nc.why, "NCCL at %s is version %d; medley needs %d or newer", path,
                 v, NCCL_MIN_VERSION);
    if (nc.why[0]) {
        dlclose(nc.lib);
        nc.lib = NULL;
    }
}

/* 0 once the library is loaded, else MD_EUNSUPP with why. */
static int nc_ready(md_err *e) {
    pthread_once(&nc_once, nc_load);
    return nc.lib ? 0 : md_errf(e, MD_EUNSUPP, "%s", nc.why);
}

/* MD_EDEVICE for NCCL's result rc of the call described by fmt, with NCCL's sentence and its
 * last error's details; kept as m's sticky error (m may be NULL: no communicator yet). */
static int nc_fail(md_comm *m, ncclResult_t rc, md_err *e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int nc_fail(md_comm *m, ncclResult_t rc, md_err *e, const char *fmt, ...) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *last = nc.get_last_error(m ? m->comm : NULL);
    int detail = last && *last;
    md_err er;
    md_errf(&er, MD_EDEVICE, "%s: %s%s%s%s", what, nc.get_error_string(rc), detail ? " (" : "",
            detail ? last : "", detail ? ")" : "");
    if (m && !m->failed.code)
        m->failed = er;
    if (e)
        *e = er;
    return MD_EDEVICE;
}

/* 0 when m may take another call from c: it has no error of its own (sticky, or one NCCL
 * found asynchronously), c none either, and c's device is current. */
static int comm_ok(cuda_ctx *c, md_comm *m, const char *op, md_err *e) {
    if (m->failed.code) {
        if (e)
            *e = m->failed;
        return m->failed.code;
    }
    if (cuda_ctx_ordinal(c) != m->ordinal)
        return md_errf(e, MD_EINVAL, "cuda:%d %s on a communicator of cuda:%d", cuda_ctx_ordinal(c),
                       op, m->ordinal);
    int rc = cuda_ctx_failed(c, e);
    if (rc)
        return rc;
    ncclResult_t st = ncclSuccess, q = nc.comm_get_async_error(m->comm, &st);
    if (q != ncclSuccess || st != ncclSuccess)
        return nc_fail(m, q != ncclSuccess ? q : st, e, "cuda:%d %s (rank %d of %d)", m->ordinal,
                       op, m->rank, m->n);
    cudaSetDevice(m->ordinal);
    return 0;
}

int cuda_comm_unique_id(uint8_t id[CUDA_COMM_ID_BYTES], md_err *e) {
    int rc = nc_ready(e);
    if (rc)
        return rc;
    ncclUniqueId u;
    ncclResult_t r = nc.get_unique_id(&u);
    if (r != ncclSuccess)
        return nc_fail(NULL, r, e, "NCCL communicator id");
    memcpy(id, &u, sizeof u);
    return 0;
}

int cuda_comm_init(cuda_ctx *c, const uint8_t id[CUDA_COMM_ID_BYTES], int rank, int n,
                   md_comm **out, md_err *e) {
    *out = NULL;
    int ord = cuda_ctx_ordinal(c);
    if (n < 1 || rank < 0 || rank >= n)
        return md_errf(e, MD_EINVAL, "cuda:%d: rank %d of a communicator of %d ranks", ord, rank,
                       n);
    int rc = nc_ready(e);
    if (rc || (rc = cuda_ctx_failed(c, e)))
        return rc;
    md_comm *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "cuda:%d: out of host memory for a communicator", ord);
    m->ordinal = ord;
    m->rank = rank;
    m->n = n;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    cudaError_t ce = cudaSetDevice(ord); /* NCCL takes the current device as the rank's */
    ncclResult_t r = ce == cudaSuccess ? nc.comm_init_rank(&m->comm, n, u, rank) : ncclSuccess;
    if (ce != cudaSuccess || r != ncclSuccess) {
        if (ce != cudaSuccess)
            md_errf(e, MD_EDEVICE, "cuda:%d joining a communicator as rank %d of %d: %s", ord, rank,
                    n, cudaGetErrorString(ce));
        else
            nc_fail(NULL, r, e, "cuda:%d joining a communicator as rank %d of %d", ord, rank, n);
        cudaGetLastError();
        free(m);
        return MD_EDEVICE;
    }
    *out = m;
    return 0;
}

void cuda_comm_free(cuda_ctx *c, md_comm *m) {
    if (!m)
        return;
    cudaSetDevice(m->ordinal);
    if (m->failed.code) { /* its kernels may wait for peers that will not come */
        nc.comm_abort(m->comm);
        cuda_sync(c, NULL);
    } else {
        cuda_sync(c, NULL); /* nothing queued may still use it */
        nc.comm_destroy(m->comm);
    }
    free(m);
}

int cuda_comm_all_reduce(cuda_ctx *c, md_comm *m, float *x, int64_t n, md_err *e) {
    if (n < 0)
        return md_errf(e, MD_EINVAL, "cuda:%d all-reduce of %lld floats", m->ordinal, (long long)n);
    int rc = comm_ok(c, m, "all-reduce", e);
    if (rc || n == 0) /* every rank has the same n: all of them skip it */
        return rc;
    ncclResult_t r =
        nc.all_reduce(x, x, (size_t)n, ncclFloat32, ncclSum, m->comm, cuda_ctx_stream(c));
    if (r != ncclSuccess)
        return nc_fail(m, r, e, "cuda:%d all-reduce of %lld floats (rank %d of %d)", m->ordinal,
                       (long long)n, m->rank, m->n);
    return 0;
}

/* send (dir 0) or receive (dir 1) `bytes` bytes at p to or from peer. */
static int send_recv(cuda_ctx *c, md_comm *m, int dir, void *p, size_t bytes, int peer, md_err *e) {
    const char *op = dir ? "receive" : "send";
    if (peer < 0 || peer >= m->n)
        return md_errf(e, MD_EINVAL, "cuda:%d %s of %zu bytes: peer %d of a communicator of %d",
                       m->ordinal, op, bytes, peer, m->n);
    int rc = comm_ok(c, m, op, e);
    if (rc || bytes == 0) /* the peer's matching call has the same size */
        return rc;
    ncclResult_t r = dir ? nc.recv(p, bytes, ncclUint8, peer, m->comm, cuda_ctx_stream(c))
                         : nc.send(p, bytes, ncclUint8, peer, m->comm, cuda_ctx_stream(c));
    if (r != ncclSuccess)
        return nc_fail(m, r, e, "cuda:%d %s of %zu bytes %s rank %d (rank %d of %d)", m->ordinal,
                       op, bytes, dir ? "from" : "to", peer, m->rank, m->n);
    return 0;
}

int cuda_comm_send(cuda_ctx *c, md_comm *m, const void *p, size_t bytes, int peer, md_err *e) {
    return send_recv(c, m, 0, (void *)p, bytes, peer, e);
}

int cuda_comm_recv(cuda_ctx *c, md_comm *m, void *p, size_t bytes, int peer, md_err *e) {
    return send_recv(c, m, 1, p, bytes, peer, e);
}

int cuda_comm_group_start(md_err *e) {
    int rc = nc_ready(e);
    if (rc)
        return rc;
    ncclResult_t r = nc.group_start();
    return r == ncclSuccess ? 0 : nc_fail(NULL, r, e, "NCCL group start");
}

int cuda_comm_group_end(md_err *e) {
    int rc = nc_ready(e);
    if (rc)
        return rc;
    ncclResult_t r = nc.group_end();
    return r == ncclSuccess ? 0 : nc_fail(NULL, r, e, "NCCL group end");
}
