/* metrics.c — see metrics.h. A family allocates its series, their label values and (for a
 * histogram) their bucket counts in one go; creating a series fills the next free one and
 * publishes it by raising the family's count (release), so readers that load the count
 * (acquire) see complete series. Values are C11 atomics; a double is added to with a
 * compare-and-swap loop (a compound assignment on an _Atomic double would need libatomic for
 * its floating-point exception handling). */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_COUNTER, T_GAUGE, T_HISTOGRAM };
static const char *const type_name[] = {"counter", "gauge", "histogram"};

#define NAME_MAX_LEN 128

struct md_series {
    md_metric *fam;
    char *values;              /* n_labels values of MD_METRIC_VALUE_MAX bytes */
    _Atomic double value;      /* counter or gauge; histogram: the sum */
    _Atomic uint64_t *buckets; /* histogram: (n_bounds + 1) counts, not cumulative */
    _Atomic int visible;       /* gauges: 0 after md_series_hide, until the next set */
};

struct md_metric {
    md_metrics *reg;
    md_metric *next;
    int type;
    char name[NAME_MAX_LEN];
    char *help;
    int n_labels;
    char labels[MD_METRIC_LABELS_MAX][NAME_MAX_LEN];
    double bounds[MD_METRIC_BUCKETS_MAX];
    int n_bounds;
    int max_series;
    _Atomic int n_series;
    md_series *series;         /* (max_series) */
    char *values;              /* (max_series * n_labels * MD_METRIC_VALUE_MAX) */
    _Atomic uint64_t *buckets; /* (max_series * (n_bounds + 1)) histograms */
};

#define HOOKS_MAX 4

struct md_metrics {
    pthread_mutex_t mu; /* held to add a family or a series, and while rendering */
    md_metric *first, *last;
    md_render_hook hooks[HOOKS_MAX]; /* run by md_metrics_render before it locks */
    void *hook_args[HOOKS_MAX];
    void (*hook_free[HOOKS_MAX])(void *); /* md_metrics_free frees hook_args with it */
    int n_hooks;
};

md_metrics *md_metrics_new(void) {
    md_metrics *reg = calloc(1, sizeof *reg);
    if (reg)
        pthread_mutex_init(&reg->mu, NULL);
    return reg;
}

void md_metrics_free(md_metrics *reg) {
    if (!reg)
        return;
    for (md_metric *m = reg->first, *next; m; m = next) {
        next = m->next;
        free(m->help);
        free(m->series);
        free(m->values);
        free(m->buckets);
        free(m);
    }
    for (int h = 0; h < reg->n_hooks; h++)
        if (reg->hook_free[h])
            reg->hook_free[h](reg->hook_args[h]);
    pthread_mutex_destroy(&reg->mu);
    free(reg);
}

static int name_ok(const char *s, int colon) {
    if (!s || !*s || strlen(s) >= NAME_MAX_LEN)
        return 0;
    for (const char *p = s; *p; p++) {
        int alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                    (colon && *p == ':');
        if (!alpha && !(p > s && *p >= '0' && *p <= '9'))
            return 0;
    }
    return 1;
}

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 when invalid. */
static int utf8_len(const unsigned char *p, size_t n) {
    int len = p[0] < 0x80             ? 1
              : (p[0] & 0xE0) == 0xC0 ? 2
              : (p[0] & 0xF0) == 0xE0 ? 3
              : (p[0] & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (!len || (size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    uint32_t c = len == 1 ? p[0] : len == 2 ? p[0] & 0x1Fu : len == 3 ? p[0] & 0x0Fu : p[0] & 0x07u;
    for (int i = 1; i < len; i++)
        c = (c << 6) | (p[i] & 0x3Fu);
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0; /* overlong, out of range, or a surrogate */
    return len;
}

/* v as a label value: invalid UTF-8 bytes become '?', cut at a character boundary to fit. */
static void clean_value(char out[MD_METRIC_VALUE_MAX], const char *v) {
    size_t k = 0, n = v ? strlen(v) : 0;
    const unsigned char *p = (const unsigned char *)(v ? v : "");
    for (size_t i = 0; i < n;) {
        int len = utf8_len(p + i, n - i);
        if (k + (size_t)(len ? len : 1) > MD_METRIC_VALUE_MAX - 1)
            break;
        if (!len) {
            out[k++] = '?';
            i++;
        } else {
            memcpy(out + k, p + i, (size_t)len);
            k += (size_t)len;
            i += (size_t)len;
        }
    }
    out[k] = '\0';
}

static md_metric *add_family(md_metrics *reg, int type, const char *name, const char *help,
                             int n_labels, const char *const *labels, int max_series,
                             const double *bounds, int n_bounds, md_err *e) {
    if (!reg) {
        md_errf(e, MD_EINVAL, "metric %s: no registry", name ? name : "(null)");
        return NULL;
    }
    if (!name_ok(name, 1)) {
        md_errf(e, MD_EINVAL, "metric name '%s' is not [a-zA-Z_:][a-zA-Z0-9_:]* (under %d bytes)",
                name ? name : "(null)", NAME_MAX_LEN);
        return NULL;
    }
    if (n_labels < 0 || n_labels > MD_METRIC_LABELS_MAX || (n_labels && !labels)) {
        md_errf(e, MD_EINVAL, "metric %s: %d labels (at most %d)", name, n_labels,
                MD_METRIC_LABELS_MAX);
        return NULL;
    }
    for (int i = 0; i < n_labels; i++)
        if (!name_ok(labels[i], 0) || !strncmp(labels[i], "__", 2) ||
            (type == T_HISTOGRAM && !strcmp(labels[i], "le"))) {
            md_errf(e, MD_EINVAL, "metric %s: label name '%s' is not allowed", name,
                    labels[i] ? labels[i] : "(null)");
            return NULL;
        }
    if (max_series < 1 || (n_labels == 0 && max_series != 1)) {
        md_errf(e, MD_EINVAL, "metric %s: room for %d series (a family without labels has 1)", name,
                max_series);
        return NULL;
    }
    if (type == T_HISTOGRAM) {
        if (n_bounds < 1 || n_bounds > MD_METRIC_BUCKETS_MAX || !bounds) {
            md_errf(e, MD_EINVAL, "histogram %s: %d bucket bounds (1..%d)", name, n_bounds,
                    MD_METRIC_BUCKETS_MAX);
            return NULL;
        }
        for (int i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1])) {
                md_errf(e, MD_EINVAL, "histogram %s: bucket bounds must be finite and increasing",
                        name);
                return NULL;
            }
    }
    md_metric *m = calloc(1, sizeof *m);
    if (!m) {
        md_errf(e, MD_ENOMEM, "out of memory for metric %s", name);
        return NULL;
    }
    m->reg = reg;
    m->type = type;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->help = strdup(help ? help : "");
    m->n_labels = n_labels;
    for (int i = 0; i < n_labels; i++)
        snprintf(m->labels[i], sizeof m->labels[i], "%s", labels[i]);
    m->n_bounds = type == T_HISTOGRAM ? n_bounds : 0;
    for (int i = 0; i < m->n_bounds; i++)
        m->bounds[i] = bounds[i];
    m->max_series = max_series;
    m->series = calloc((size_t)max_series, sizeof *m->series);
    m->values = calloc((size_t)max_series * (size_t)(n_labels ? n_labels : 1), MD_METRIC_VALUE_MAX);
    if (type == T_HISTOGRAM)
        m->buckets = calloc((size_t)max_series * (size_t)(n_bounds + 1), sizeof *m->buckets);
    if (!m->help || !m->series || !m->values || (type == T_HISTOGRAM && !m->buckets)) {
        free(m->help);
        free(m->series);
        free(m->values);
        free(m->buckets);
        free(m);
        md_errf(e, MD_ENOMEM, "out of memory for metric %s", name);
        return NULL;
    }
    for (int i = 0; i < max_series; i++) {
        md_series *s = &m->series[i];
        s->fam = m;
        s->values = m->values + (size_t)i * (size_t)n_labels * MD_METRIC_VALUE_MAX;
        s->buckets = m->buckets ? m->buckets + (size_t)i * (size_t)(n_bounds + 1) : NULL;
        atomic_init(&s->visible, 1);
    }
    pthread_mutex_lock(&reg->mu);
    int dup = 0;
    for (md_metric *o = reg->first; o && !dup; o = o->next)
        dup = !strcmp(o->name, name);
    if (!dup) {
        if (reg->last)
            reg->last->next = m;
        else
            reg->first = m;
        reg->last = m;
        if (n_labels == 0)
            atomic_store_explicit(&m->n_series, 1, memory_order_release);
    }
    pthread_mutex_unlock(&reg->mu);
    if (dup) {
        free(m->help);
        free(m->series);
        free(m->values);
        free(m->buckets);
        free(m);
        md_errf(e, MD_EINVAL, "metric %s is registered already", name);
        return NULL;
    }
    return m;
}

md_metric *md_metrics_counter(md_metrics *reg, const char *name, const char *help, int n_labels,
                              const char *const *labels, int max_series, md_err *e) {
    return add_family(reg, T_COUNTER, name, help, n_labels, labels, max_series, NULL, 0, e);
}

md_metric *md_metrics_gauge(md_metrics *reg, const char *name, const char *help, int n_labels,
                            const char *const *labels, int max_series, md_err *e) {
    return add_family(reg, T_GAUGE, name, help, n_labels, labels, max_series, NULL, 0, e);
}

md_metric *md_metrics_histogram(md_metrics *reg, const char *name, const char *help, int n_labels,
                                const char *const *labels, int max_series, const double *bounds,
                                int n_bounds, md_err *e) {
    return add_family(reg, T_HISTOGRAM, name, help, n_labels, labels, max_series, bounds, n_bounds,
                      e);
}

/* Index of the series among the first n whose values are vals, or -1. */
static int find_series(const md_metric *m, int n, char vals[][MD_METRIC_VALUE_MAX]) {
    for (int i = 0; i < n; i++) {
        int same = 1;
        for (int k = 0; k < m->n_labels && same; k++)
            same = !strcmp(m->series[i].values + (size_t)k * MD_METRIC_VALUE_MAX, vals[k]);
        if (same)
            return i;
    }
    return -1;
}

md_series *md_metric_at(md_metric *m, const char *const *values) {
    if (!m)
        return NULL;
    if (m->n_labels == 0)
        return &m->series[0];
    char vals[MD_METRIC_LABELS_MAX][MD_METRIC_VALUE_MAX];
    for (int k = 0; k < m->n_labels; k++)
        clean_value(vals[k], values ? values[k] : "");
    int n = atomic_load_explicit(&m->n_series, memory_order_acquire);
    int i = find_series(m, n, vals);
    if (i >= 0)
        return &m->series[i];
    /* New: only the mutex's holder adds series, so n cannot move under it. */
    pthread_mutex_lock(&m->reg->mu);
    n = atomic_load_explicit(&m->n_series, memory_order_relaxed);
    i = find_series(m, n, vals);
    if (i < 0 && n < m->max_series) {
        md_series *s = &m->series[n];
        for (int k = 0; k < m->n_labels; k++)
            memcpy(s->values + (size_t)k * MD_METRIC_VALUE_MAX, vals[k], MD_METRIC_VALUE_MAX);
        atomic_store_explicit(&m->n_series, n + 1, memory_order_release);
        i = n;
    } else if (i < 0 && m->type == T_GAUGE) {
        /* full: a hidden gauge is not rendered, so its room can hold the new label set */
        for (int h = 0; h < n && i < 0; h++) {
            md_series *s = &m->series[h];
            if (atomic_load_explicit(&s->visible, memory_order_relaxed))
                continue;
            for (int k = 0; k < m->n_labels; k++)
                memcpy(s->values + (size_t)k * MD_METRIC_VALUE_MAX, vals[k], MD_METRIC_VALUE_MAX);
            atomic_store_explicit(&s->value, 0, memory_order_relaxed);
            i = h;
        }
    }
    pthread_mutex_unlock(&m->reg->mu);
    return i >= 0 ? &m->series[i] : NULL;
}

md_series *md_metric_at0(md_metric *m) {
    return md_metric_at(m, NULL);
}

md_series *md_metric_at1(md_metric *m, const char *v0) {
    const char *v[1] = {v0};
    return md_metric_at(m, v);
}

md_series *md_metric_at2(md_metric *m, const char *v0, const char *v1) {
    const char *v[2] = {v0, v1};
    return md_metric_at(m, v);
}

static void add_double(_Atomic double *p, double x) {
    double old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, old + x, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void md_counter_add(md_series *s, double x) {
    if (s && x > 0)
        add_double(&s->value, x);
}

void md_gauge_set(md_series *s, double x) {
    if (!s)
        return;
    atomic_store_explicit(&s->value, x, memory_order_relaxed);
    atomic_store_explicit(&s->visible, 1, memory_order_relaxed);
}

void md_histogram_observe(md_series *s, double x) {
    if (!s || !s->buckets || isnan(x))
        return;
    const md_metric *m = s->fam;
    int b = 0;
    while (b < m->n_bounds && x > m->bounds[b])
        b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    add_double(&s->value, x);
}

void md_series_hide(md_series *s) {
    if (s)
        atomic_store_explicit(&s->visible, 0, memory_order_relaxed);
}

double md_series_value(const md_series *s) {
    return s ? atomic_load_explicit(&((md_series *)s)->value, memory_order_relaxed) : 0;
}

/* ---- rendering ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(buf *b, const char *s) {
    put(b, s, strlen(s));
}

/* s with '\\' and newlines escaped, and '"' too when in_quotes (a label value). */
static void put_escaped(buf *b, const char *s, int in_quotes) {
    for (; *s; s++) {
        if (*s == '\\')
            puts_(b, "\\\\");
        else if (*s == '\n')
            puts_(b, "\\n");
        else if (*s == '"' && in_quotes)
            puts_(b, "\\\"");
        else
            put(b, s, 1);
    }
}

/* x as the text format writes floats: the shortest of %.15g / %.17g that reads back. */
static void put_number(buf *b, double x) {
    char t[40];
    if (isnan(x))
        snprintf(t, sizeof t, "NaN");
    else if (isinf(x))
        snprintf(t, sizeof t, x > 0 ? "+Inf" : "-Inf");
    else {
        snprintf(t, sizeof t, "%.15g", x);
        if (strtod(t, NULL) != x)
            snprintf(t, sizeof t, "%.17g", x);
    }
    puts_(b, t);
}

/* {a="x",b="y"[,le="..."]} or nothing when there is no label. */
static void put_labels(buf *b, const md_series *s, const char *le) {
    const md_metric *m = s->fam;
    if (!m->n_labels && !le)
        return;
    puts_(b, "{");
    for (int k = 0; k < m->n_labels; k++) {
        if (k)
            puts_(b, ",");
        puts_(b, m->labels[k]);
        puts_(b, "=\"");
        put_escaped(b, s->values + (size_t)k * MD_METRIC_VALUE_MAX, 1);
        puts_(b, "\"");
    }
    if (le) {
        puts_(b, m->n_labels ? ",le=\"" : "le=\"");
        puts_(b, le);
        puts_(b, "\"");
    }
    puts_(b, "}");
}

static void render_series(buf *b, md_series *s) {
    const md_metric *m = s->fam;
    if (m->type != T_HISTOGRAM) {
        if (m->type == T_GAUGE && !atomic_load_explicit(&s->visible, memory_order_relaxed))
            return;
        puts_(b, m->name);
        put_labels(b, s, NULL);
        puts_(b, " ");
        put_number(b, atomic_load_explicit(&s->value, memory_order_relaxed));
        puts_(b, "\n");
        return;
    }
    /* Buckets cumulative; _count is the +Inf bucket so the two always agree even while
     * observations land during the render. */
    uint64_t cum = 0;
    for (int i = 0; i <= m->n_bounds; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        char le[40];
        if (i == m->n_bounds) {
            snprintf(le, sizeof le, "+Inf");
        } else {
            buf t = {0};
            put_number(&t, m->bounds[i]);
            snprintf(le, sizeof le, "%s", t.p ? t.p : "0");
            free(t.p);
        }
        puts_(b, m->name);
        puts_(b, "_bucket");
        put_labels(b, s, le);
        char v[32];
        snprintf(v, sizeof v, " %llu\n", (unsigned long long)cum);
        puts_(b, v);
    }
    puts_(b, m->name);
    puts_(b, "_sum");
    put_labels(b, s, NULL);
    puts_(b, " ");
    put_number(b, atomic_load_explicit(&s->value, memory_order_relaxed));
    puts_(b, "\n");
    puts_(b, m->name);
    puts_(b, "_count");
    put_labels(b, s, NULL);
    char v[32];
    snprintf(v, sizeof v, " %llu\n", (unsigned long long)cum);
    puts_(b, v);
}

int md_metrics_on_render(md_metrics *reg, md_render_hook fn, void *arg, void (*free_arg)(void *)) {
    if (!reg || !fn || reg->n_hooks >= HOOKS_MAX)
        return -1;
    reg->hooks[reg->n_hooks] = fn;
    reg->hook_args[reg->n_hooks] = arg;
    reg->hook_free[reg->n_hooks] = free_arg;
    reg->n_hooks++;
    return 0;
}

char *md_metrics_render(md_metrics *reg, size_t *len) {
    for (int h = 0; h < reg->n_hooks; h++)
        reg->hooks[h](reg->hook_args[h]);
    buf b = {0};
    puts_(&b, ""); /* an empty registry renders as "" */
    pthread_mutex_lock(&reg->mu);
    for (md_metric *m = reg->first; m; m = m->next) {
        puts_(&b, "# HELP ");
        puts_(&b, m->name);
        puts_(&b, " ");
        put_escaped(&b, m->help, 0);
        puts_(&b, "\n# TYPE ");
        puts_(&b, m->name);
        puts_(&b, " ");
        puts_(&b, type_name[m->type]);
        puts_(&b, "\n");
        int n = atomic_load_explicit(&m->n_series, memory_order_acquire);
        for (int i = 0; i < n; i++)
            render_series(&b, &m->series[i]);
    }
    pthread_mutex_unlock(&reg->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.n;
    return b.p;
}
