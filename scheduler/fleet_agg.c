/* fleet_agg.c — identical hosts merged into one pool before planning (docs/scheduler.md §4),
 * and the map between a pool's GPU index k and its id "<host>/<i>", for pools with a host list
 * (merged ones) and without (GPU k is "<pool>/<k>", hosts are runs of gpus_per_host).
 *
 * The daemon builds one pool per worker and GPU type; 125 workers of 8 GPUs are then 125
 * pools, and the MILP has a column per candidate per pool and a GPU row per pool and TP size.
 * Hosts of the same type, size and price are interchangeable, so the plan only needs how many
 * replicas go to each kind of host: the merged pool keeps its hosts so that GPU ids (and TP
 * groups inside one host) are assigned after the solve. */
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"

int sched_pool_nhosts(const sched_pool *p) {
    if (p->hosts)
        return p->nhosts;
    return p->gpus_per_host > 0 ? (p->count + p->gpus_per_host - 1) / p->gpus_per_host : 0;
}

int sched_pool_host(const sched_pool *p, int h, int *k0) {
    if (p->hosts) {
        *k0 = p->hosts[h].at;
        return p->hosts[h].gpus;
    }
    int lo = h * p->gpus_per_host, hi = lo + p->gpus_per_host;
    *k0 = lo;
    return (hi > p->count ? p->count : hi) - lo;
}

/* The host of a list holding pool GPU k: the last whose first GPU is at or before k. */
static int host_of(const sched_pool *p, int k) {
    int lo = 0, hi = p->nhosts - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (p->hosts[mid].at <= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void sched_pool_gpu_id(const sched_pool *p, int k, char id[SCHED_ID]) {
    if (!p->hosts) {
        snprintf(id, SCHED_ID, "%s/%d", p->name, k);
        return;
    }
    const sched_host *h = &p->hosts[host_of(p, k)];
    snprintf(id, SCHED_ID, "%s/%d", h->name, h->first + k - h->at);
}

/* "<name>/<i>" split at its last '/' into name and i >= 0; 0, or -1 when id is not so. */
static int split_id(const char *id, char name[SCHED_ID], long *i) {
    const char *slash = strrchr(id, '/');
    if (!slash || slash == id || (size_t)(slash - id) >= SCHED_ID || !slash[1] ||
        strlen(slash + 1) > 9)
        return -1;
    for (const char *c = slash + 1; *c; c++)
        if (*c < '0' || *c > '9')
            return -1;
    memcpy(name, id, (size_t)(slash - id));
    name[slash - id] = 0;
    *i = strtol(slash + 1, NULL, 10);
    return 0;
}

int sched_pool_find_gpu(const sched_pool *p, const char *id, int *host) {
    char name[SCHED_ID];
    long i;
    if (split_id(id, name, &i))
        return -1;
    if (!p->hosts) {
        if (strcmp(name, p->name) || i >= p->count)
            return -1;
        *host = (int)(i / p->gpus_per_host);
        return (int)i;
    }
    /* Hosts are in (name, first) order: the first host named name, then its runs. */
    int lo = 0, hi = p->nhosts;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(p->hosts[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int h = lo; h < p->nhosts && !strcmp(p->hosts[h].name, name); h++)
        if (i >= p->hosts[h].first && i < p->hosts[h].first + p->hosts[h].gpus) {
            *host = h;
            return p->hosts[h].at + (int)(i - p->hosts[h].first);
        }
    return -1;
}

static int same_kind(const sched_pool *a, const sched_pool *b) {
    return a->type == b->type && a->gpus_per_host == b->gpus_per_host &&
           a->memory_gb == b->memory_gb && a->usd_per_hour == b->usd_per_hour &&
           !strcmp(a->price_from, b->price_from);
}

static int cmp_host(const void *a, const void *b) {
    const sched_host *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

/* The pools of f whose leader is `lead` merged into *out (hosts malloc'd, in name order). */
static int merge(const sched_fleet *f, const int *leader, int lead, sched_pool *out) {
    int nh = 0;
    for (int i = lead; i < f->n; i++)
        if (leader[i] == lead)
            nh += sched_pool_nhosts(&f->pools[i]);
    sched_host *hs = calloc((size_t)nh + 1, sizeof *hs);
    if (!hs)
        return MD_ENOMEM;
    int at = 0;
    for (int i = lead; i < f->n; i++) {
        const sched_pool *m = &f->pools[i];
        for (int h = 0; leader[i] == lead && h < sched_pool_nhosts(m); h++) {
            sched_host *x = &hs[at++];
            int k0;
            x->gpus = sched_pool_host(m, h, &k0);
            x->first = m->hosts ? m->hosts[h].first : k0;
            memcpy(x->name, m->hosts ? m->hosts[h].name : m->name, SCHED_ID);
        }
    }
    qsort(hs, (size_t)nh, sizeof *hs, cmp_host);
    *out = f->pools[lead];
    out->count = 0;
    out->gpus_per_host = 0;
    for (int h = 0; h < nh; h++) {
        hs[h].at = out->count;
        out->count += hs[h].gpus;
        if (hs[h].gpus > out->gpus_per_host)
            out->gpus_per_host = hs[h].gpus;
    }
    out->hosts = hs;
    out->nhosts = nh;
    snprintf(out->name, sizeof out->name, "%.22s..%.22s", hs[0].name, hs[nh - 1].name);
    return 0;
}

int sched_fleet_aggregate(sched_fleet *f, md_err *e) {
    if (f->rent || f->n < 2)
        return 0;
    int *leader = malloc((size_t)f->n * sizeof *leader);
    int *kinds = calloc((size_t)f->n, sizeof *kinds); /* the leaders, in order */
    int *size = calloc((size_t)f->n, sizeof *size);   /* per leader: pools of its kind */
    sched_pool *np = calloc((size_t)f->n, sizeof *np);
    if (!leader || !kinds || !size || !np) {
        free(leader);
        free(kinds);
        free(size);
        free(np);
        return md_errf(e, MD_ENOMEM, "out of memory merging %d pools", f->n);
    }
    /* A pool joins the first earlier pool of its kind (kinds are few: a short scan). */
    int nk = 0;
    for (int i = 0; i < f->n; i++) {
        leader[i] = i;
        for (int k = 0; k < nk; k++)
            if (same_kind(&f->pools[kinds[k]], &f->pools[i])) {
                leader[i] = kinds[k];
                break;
            }
        if (leader[i] == i)
            kinds[nk++] = i;
        size[leader[i]]++;
    }
    int rc = 0, n = 0;
    for (int k = 0; k < nk && !rc; k++) {
        if (size[kinds[k]] == 1)
            np[n++] = f->pools[kinds[k]];
        else if (!(rc = merge(f, leader, kinds[k], &np[n])))
            n++;
    }
    if (!rc) {
        /* The merged pools' own host lists were copied; a pool alone keeps its list. */
        for (int i = 0; i < f->n; i++)
            if (size[leader[i]] > 1)
                free(f->pools[i].hosts);
        free(f->pools);
        f->pools = np;
        f->n = n;
    } else {
        for (int k = 0; k < n; k++)
            if (size[kinds[k]] > 1)
                free(np[k].hosts);
        free(np);
        md_errf(e, MD_ENOMEM, "out of memory merging %d pools", f->n);
    }
    free(leader);
    free(kinds);
    free(size);
    return rc;
}
