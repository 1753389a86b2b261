/* metrics_process.h — the metrics every medley process serves beside its own (docs/
 * operations.md, "Metrics"): Prometheus's standard process_* families (CPU seconds, resident
 * and virtual memory, start time, open and maximum file descriptors, from /proc/self) and
 * medley_build_info{version, revision, cuda}. Their values are read when the registry is
 * rendered (md_metrics_on_render), on the HTTP server's thread, so they answer while the
 * process's own loop may hang. */
#ifndef MEDLEY_COMMON_METRICS_PROCESS_H
#define MEDLEY_COMMON_METRICS_PROCESS_H

#include "common/err.h"
#include "common/metrics.h"

/* Add the families to reg and the render hook that refreshes them. Once per registry; the
 * state lives in reg's families (nothing to free). Returns 0 or the error. */
int md_metrics_process_add(md_metrics *reg, md_err *e);

#endif
