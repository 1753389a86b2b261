/* backend.c — device names and facts (md_device_*), opening a backend by device name,
 * cross-backend copies and RoPE frequency tables shared by every backend. */
#include "kernels/backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#ifdef MEDLEY_HAVE_CUDA
#endif

static int parse_index(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 4096)
        return -1;
    *out = (int)v;
    return 0;
}

/* "cuda", "cuda:K", "cuda-exact" or "cuda-exact:K": 1 with the ordinal in *ord (0 when
 * none is given) and *exact set, -1 for a CUDA name with a bad ordinal, 0 for any other. */
static int cuda_name(const char *device, int *ord, int *exact) {
    const char *rest;
    if (!strncmp(device, "cuda-exact", 10))
        *exact = 1, rest = device + 10;
    else if (!strncmp(device, "cuda", 4))
        *exact = 0, rest = device + 4;
    else
        return 0;
    *ord = 0;
    if (*rest == 0)
        return 1;
    if (*rest != ':')
        return 0;
    return parse_index(rest + 1, ord) ? -1 : 1;
}

int md_device_parse(const char *device, md_device_id *out, md_err *e) {
    memset(out, 0, sizeof *out);
    out->kind = MD_DEVICE_CPU;
    if (!device || !*device || !strcmp(device, "cpu"))
        return 0;
    if (!strcmp(device, "cpu-exact")) {
        out->exact = 1;
        return 0;
    }
    if (!strncmp(device, "cpu:", 4)) {
        if (parse_index(device + 4, &out->index) || out->index == 0)
            return md_errf(e, MD_EINVAL, "device \"%s\": expected cpu:N with N threads >= 1",
                           device);
        return 0;
    }
    int kind = cuda_name(device, &out->index, &out->exact);
    if (kind < 0)
        return md_errf(e, MD_EINVAL, "device \"%s\": expected %s:K with K a GPU ordinal", device,
                       out->exact ? "cuda-exact" : "cuda");
    if (kind > 0) {
        out->kind = MD_DEVICE_CUDA;
        return 0;
    }
    return md_errf(e, MD_EINVAL,
                   "unknown device \"%s\" (expected auto, cpu, cpu:N, cpu-exact, cuda:K or "
                   "cuda-exact:K)",
                   device);
}

int md_device_count(char *why, size_t whysz) {
#ifdef MEDLEY_HAVE_CUDA
    return md_cuda_device_count(why, whysz);
#else
    if (why && whysz)
        snprintf(why, whysz, "medley was built without CUDA");
    return 0;
#endif
}

int md_device_get(int ordinal, md_device_info *out, md_err *e) {
#ifdef MEDLEY_HAVE_CUDA
    return md_cuda_device_get(ordinal, out, e);
#else
    memset(out, 0, sizeof *out);
    return md_errf(e, MD_EUNSUPP, "cuda:%d: medley was built without CUDA", ordinal);
#endif
}

int md_backend_resolve(const char *device, char *out, size_t n, md_err *e) {
    int kind, ord, exact;
    if (!device || !*device)
        device = "cpu";
    if (!strcmp(device, "auto")) {
        const char *pick = "cpu";
#ifdef MEDLEY_HAVE_CUDA
        char why[256] = "";
        md_device_info d;
        md_err de = {0};
        if (md_device_count(why, sizeof why) > 0 && md_device_get(0, &d, &de) == 0) {
            pick = "cuda:0";
            MD_INFO("device", "auto: cuda:0 (%s, %.1f GiB, %.1f GiB free): a CUDA device is usable",
                    d.name, d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0);
        } else {
            MD_INFO("device", "auto: cpu: no CUDA device is usable (%s)", why[0] ? why : de.msg);
        }
#else
        MD_INFO("device", "auto: cpu: medley was built without CUDA");
#endif
        device = pick;
    } else if ((kind = cuda_name(device, &ord, &exact)) != 0) {
        if (kind < 0)
            return md_errf(e, MD_EINVAL, "device \"%s\": expected %s:K with K a GPU ordinal",
                           device, exact ? "cuda-exact" : "cuda");
#ifdef MEDLEY_HAVE_CUDA
        md_device_info d;
        if (md_device_get(ord, &d, e))
            return md_errctx(e, "device \"%s\": ", device);
#else
        return md_errf(e, MD_EUNSUPP, "device \"%s\": medley was built without CUDA", device);
#endif
    }
    if (strlen(device) >= n)
        return md_errf(e, MD_ERANGE, "device name \"%s\" is too long", device);
    memcpy(out, device, strlen(device) + 1);
    return 0;
}

#define MAX_EXTRA 8
static struct {
    char prefix[32];
    md_backend_open_fn open;
} g_extra[MAX_EXTRA];
static int g_n_extra;

static int builtin_name(const char *p) {
    static const char *const names[] = {"auto", "cpu", "cpu-exact", "cuda", "cuda-exact"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(p, names[i]))
            return 1;
    return 0;
}

int md_backend_register(const char *prefix, md_backend_open_fn open, md_err *e) {
    if (!prefix || !*prefix || strlen(prefix) >= sizeof g_extra[0].prefix || strchr(prefix, ':') ||
        !open)
        return md_errf(e, MD_EINVAL, "backend registration: bad device prefix \"%s\"",
                       prefix ? prefix : "(null)");
    if (builtin_name(prefix))
        return md_errf(e, MD_EINVAL, "backend registration: \"%s\" is a built-in device", prefix);
    for (int i = 0; i < g_n_extra; i++)
        if (!strcmp(g_extra[i].prefix, prefix)) {
            g_extra[i].open = open;
            return 0;
        }
    if (g_n_extra == MAX_EXTRA)
        return md_errf(e, MD_ERANGE, "backend registration: at most %d extra devices", MAX_EXTRA);
    snprintf(g_extra[g_n_extra].prefix, sizeof g_extra[0].prefix, "%s", prefix);
    g_extra[g_n_extra++].open = open;
    return 0;
}

int md_backend_open(const char *device, int n_threads, md_backend **out, md_err *e) {
    *out = NULL;
    for (int i = 0; device && i < g_n_extra; i++) {
        size_t n = strlen(g_extra[i].prefix);
        if (!strncmp(device, g_extra[i].prefix, n) && (device[n] == 0 || device[n] == ':'))
            return g_extra[i].open(device, n_threads, out, e);
    }
    if (device && !strcmp(device, "auto")) {
        char name[32];
        int rc = md_backend_resolve(device, name, sizeof name, e);
        if (rc)
            return rc;
        return md_backend_open(name, n_threads, out, e);
    }
    md_device_id id;
    int rc = md_device_parse(device, &id, e);
    if (rc)
        return rc;
    if (id.kind == MD_DEVICE_CPU) {
        if (id.exact)
            return md_backend_cpu_exact_open(n_threads, out, e);
        return md_backend_cpu_open(id.index ? id.index : n_threads, out, e);
    }
#ifdef MEDLEY_HAVE_CUDA
    return id.exact ? md_backend_cuda_exact_open(id.index, out, e)
                    : md_backend_cuda_open(id.index, out, e);
#else
    return md_errf(e, MD_EUNSUPP, "device \"%s\": medley was built without CUDA", device);
#endif
}

void md_backend_free(md_backend *be) {
    if (be)
        be->ops->free(be);
}

int md_backend_copy(md_backend *src_be, const md_buf *src, size_t src_off, md_backend *dst_be,
                    md_buf *dst, size_t dst_off, size_t n, void *staging, md_err *e) {
    int rc = src_be->ops->buf_download(src_be, src, src_off, staging, n, e);
    if (rc)
        return rc;
    return dst_be->ops->buf_upload(dst_be, dst, dst_off, staging, n, e);
}

void md_rope_inv_freq(const md_rope_cfg *c, int rot_dims, float *inv_freq) {
    double scale = c->linear_scale > 0 ? c->linear_scale : 1.0;
    for (int i = 0; i < rot_dims / 2; i++) {
        double f = pow((double)c->theta, -2.0 * i / rot_dims) / scale;
        if (c->llama3_factor > 0) {
            double low_wl = c->llama3_orig_ctx / c->llama3_low_freq_factor;
            double high_wl = c->llama3_orig_ctx / c->llama3_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f /= c->llama3_factor;
            } else if (wl >= high_wl) {
                double smooth = (c->llama3_orig_ctx / wl - c->llama3_low_freq_factor) /
                                (c->llama3_high_freq_factor - c->llama3_low_freq_factor);
                f = (1 - smooth) * f / c->llama3_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}
