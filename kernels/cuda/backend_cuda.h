/* backend_cuda.h — CUDA device facts without CUDA headers, for the GPU tests (kernels/backend.c
 * answers md_device_count / md_device_get from the two declared in backend.h). Code outside
 * kernels/ uses kernels/backend.h instead; the backend itself is reached through it too
 * (md_backend_cuda_open). All functions work, and report "no device", on hosts without a GPU
 * or driver. */
#ifndef MEDLEY_KERNELS_CUDA_BACKEND_CUDA_H
#define MEDLEY_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "common/err.h"
#include "kernels/backend.h"

/* Usable CUDA devices; 0 with the driver's reason in why (may be NULL) when none. (Also
 * declared in kernels/backend.h for MEDLEY_HAVE_CUDA builds, which backend.c reads.) */
int md_cuda_device_count(char *why, size_t whysz);
/* Describe device `ordinal`: MD_EDEVICE with a sentence when it does not exist. */
int md_cuda_device_get(int ordinal, md_device_info *out, md_err *e);
/* Refuse before loading: MD_ENOMEM "what needs X GiB, cuda:N has Y GiB free of Z GiB"
 * when need_bytes exceed the device's free memory. */
int md_cuda_check_fits(int ordinal, size_t need_bytes, const char *what, md_err *e);

/* Decode-step CUDA graphs of every CUDA backend of this process since it started:
 * recorded (captured), replayed, failed captures re-run directly. For logs and tests. */
typedef struct {
    long recorded, replayed, reruns;
} md_cuda_graph_totals;
void md_cuda_graph_get_totals(md_cuda_graph_totals *out);

#endif
