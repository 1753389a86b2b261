/* metrics.h — Prometheus metrics in process: a registry of metric families (counters, gauges,
 * histograms), each with a fixed list of label names and room for a fixed number of labelled
 * series, rendered to the text exposition format 0.0.4 (docs/operations.md, "Metrics").
 *
 * Threads: one or more threads update series while another renders (the HTTP server of
 * common/metrics_http.h). Updating a series is lock-free and allocation-free (atomics); a
 * series is created once, without allocating (the family's room is allocated with it), under
 * the registry's mutex, which a render holds while it reads the values and formats the text.
 * Callers on a hot path keep the md_series pointers they got.
 *
 * Label values: any bytes; invalid UTF-8 is replaced by '?', and values are cut at
 * MD_METRIC_VALUE_MAX - 1 bytes (on a character boundary). Keep label sets bounded (models,
 * error codes, streams): never an id per request.
 *
 * Ownership: the registry owns its families and series; md_metrics_free frees them all (no
 * pointer into it may be used after). md_metrics_render's text is the caller's (free()). */
#ifndef MEDLEY_COMMON_METRICS_H
#define MEDLEY_COMMON_METRICS_H

#include <stddef.h>

#include "common/err.h"

#define MD_METRIC_LABELS_MAX 4
#define MD_METRIC_VALUE_MAX 128
#define MD_METRIC_BUCKETS_MAX 32

typedef struct md_metrics md_metrics; /* a registry */
typedef struct md_metric md_metric;   /* a family: one name, type, help and label names */
typedef struct md_series md_series;   /* one series of a family: its label values and value */

md_metrics *md_metrics_new(void); /* NULL when out of memory */
void md_metrics_free(md_metrics *reg);

/* A family in reg. name: [a-zA-Z_:][a-zA-Z0-9_:]*, not registered yet; label names:
 * [a-zA-Z_][a-zA-Z0-9_]*, not beginning with "__" (histograms: not "le"); max_series >= 1
 * (a family without labels has its one series from the start, at 0). Histogram bounds:
 * n_bounds (1..MD_METRIC_BUCKETS_MAX) finite upper bounds in increasing order; the +Inf
 * bucket is added. Returns NULL with e set on a bad argument or out of memory. */
md_metric *md_metrics_counter(md_metrics *reg, const char *name, const char *help, int n_labels,
                              const char *const *labels, int max_series, md_err *e);
md_metric *md_metrics_gauge(md_metrics *reg, const char *name, const char *help, int n_labels,
                            const char *const *labels, int max_series, md_err *e);
md_metric *md_metrics_histogram(md_metrics *reg, const char *name, const char *help, int n_labels,
                                const char *const *labels, int max_series, const double *bounds,
                                int n_bounds, md_err *e);

/* The series of family m with these label values (n_labels of them), created at 0 the first
 * time. NULL when m is NULL or its max_series are taken (the update functions take NULL and
 * do nothing, so a full family loses new series, never crashes) — except that a full gauge
 * family reuses the room of a hidden series (md_series_hide) for a new label set, so gauges
 * of passing things (batches) stay bounded. A family whose series are hidden and reused is
 * updated from one thread. */
md_series *md_metric_at(md_metric *m, const char *const *values);
md_series *md_metric_at0(md_metric *m); /* a family without labels */
md_series *md_metric_at1(md_metric *m, const char *v0);
md_series *md_metric_at2(md_metric *m, const char *v0, const char *v1);

/* Updates; s may be NULL. Counters only go up (a negative or NaN x is ignored). */
void md_counter_add(md_series *s, double x);
void md_gauge_set(md_series *s, double x); /* also shows a hidden series again */
void md_histogram_observe(md_series *s, double x);
/* A gauge series stops being rendered (a stream no longer read) until the next set. */
void md_series_hide(md_series *s);
double md_series_value(const md_series *s); /* counter or gauge value; histogram: the sum */

/* A function md_metrics_render runs first, on the rendering thread (the HTTP server's), to
 * set gauges whose value is read at scrape time (process figures, the age of the owner's
 * last heartbeat): what answers while the owner's own loop may hang. Up to 4 per registry,
 * added before the registry is served. free_arg (may be NULL) frees arg in md_metrics_free.
 * Returns 0, or -1 when full (arg is then still the caller's). */
typedef void (*md_render_hook)(void *arg);
int md_metrics_on_render(md_metrics *reg, md_render_hook fn, void *arg, void (*free_arg)(void *));

/* The registry as text (families in registration order); *len its length. NULL when out
 * of memory. The caller frees it. */
char *md_metrics_render(md_metrics *reg, size_t *len);

#endif
