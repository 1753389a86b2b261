/* catalog.c — the GPU catalog (scheduler/catalog/gpus.json, compiled in) and fleet files:
 * pools of GPUs of one type with their price, or the types that may be rented. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"
#include "scheduler/sched.h"

extern const unsigned char sched_catalog_json[];

/* The keys each document may hold, as schemas/gpu-catalog and schemas/fleet list them. */
static const char *const GPU_KEYS[] = {
    "name",         "aliases",   "memory_gb",   "memory_mib",        "hbm_gbps",
    "bf16_tflops",  "int8_tops", "nvlink_gbps", "pcie_gen",          "pcie_lanes",
    "usd_per_hour", "sources",   "cores",       "usd_per_core_hour", NULL};
static const char *const CATALOG_KEYS[] = {"version", "kind", "note", "gpus", NULL};
static const char *const FLEET_KEYS[] = {
    "version", "kind", "name", "inter_host_gbps", "inter_host_latency_us", "gpu_types", "prices",
    "pools",   "rent", NULL};
static const char *const POOL_KEYS[] = {
    "name", "type", "count", "gpus_per_host", "memory_gb", "usd_per_hour", "usd_per_core_hour",
    NULL};
static const char *const RENT_KEYS[] = {"types", "max_per_type", "max", NULL};

static int parse_gpu(json_t *g, sched_gpu_type *t, const char *where, md_err *e) {
    const char *name = NULL;
    double v;
    long long iv;
    memset(t, 0, sizeof *t);
    if (md_json_check_keys(g, GPU_KEYS, where, e))
        return e->code;
    if (md_json_get_str(g, "name", 1, &name, where, e))
        return e->code;
    if (strlen(name) >= SCHED_NAME)
        return md_errf(e, MD_EINVAL, "%s.name '%s' is longer than %d characters", where, name,
                       SCHED_NAME - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    struct {
        const char *k;
        double *dst;
        int required;
        double max; /* far above any card: a bound that keeps the MILP's numbers sane */
    } nums[] = {{"memory_gb", &t->memory_gb, 1, 1e4},
                {"hbm_gbps", &t->hbm_gbps, 1, 1e6},
                {"bf16_tflops", &t->bf16_tflops, 1, 1e6},
                {"int8_tops", &t->int8_tops, 0, 1e7},
                {"nvlink_gbps", &t->nvlink_gbps, 0, 1e6},
                {"usd_per_hour", &t->usd_per_hour, !json_object_get(g, "usd_per_core_hour"), 1e5},
                {"usd_per_core_hour", &t->usd_per_core_hour, 0, 1e3}};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        v = 0;
        if (md_json_get_num(g, nums[i].k, nums[i].required, &v, where, e))
            return e->code;
        if (v < 0 || (nums[i].required && v <= 0 && strcmp(nums[i].k, "usd_per_hour")))
            return md_errf(e, MD_EINVAL, "%s.%s must be positive, got %g", where, nums[i].k, v);
        if (v > nums[i].max)
            return md_errf(e, MD_EINVAL, "%s.%s is %g; at most %g is accepted", where, nums[i].k, v,
                           nums[i].max);
        *nums[i].dst = v;
    }
    /* The planner counts what the driver reports when the catalog has it (cards are sold
     * in GB and hold GiB-sized memories: an "80 GB" A100 has 81,920 MiB = 85.9e9 bytes). */
    iv = 0;
    if (md_json_get_int(g, "memory_mib", 0, &iv, where, e))
        return e->code;
    if (iv < 0 || iv > 10000000)
        return md_errf(e, MD_EINVAL, "%s.memory_mib is %lld; it must be in [1, 1e7]", where, iv);
    if (iv > 0)
        t->memory_gb = (double)iv * 1048576.0 / 1e9;
    iv = 0;
    if (md_json_get_int(g, "cores", 0, &iv, where, e))
        return e->code;
    if (iv < 0 || iv > 100000 || (json_object_get(g, "usd_per_core_hour") && iv < 1))
        return md_errf(e, MD_EINVAL,
                       "%s.cores must be in [1, 1e5] (a price per core-hour needs it), got %lld",
                       where, iv);
    t->cores = (int)iv;
    if (json_object_get(g, "usd_per_core_hour"))
        t->usd_per_hour = t->cores * t->usd_per_core_hour;
    iv = 4;
    if (md_json_get_int(g, "pcie_gen", 0, &iv, where, e))
        return e->code;
    t->pcie_gen = (int)iv;
    iv = 16;
    if (md_json_get_int(g, "pcie_lanes", 0, &iv, where, e))
        return e->code;
    t->pcie_lanes = (int)iv;
    if (t->pcie_gen < 1 || t->pcie_gen > 7 || t->pcie_lanes < 1 || t->pcie_lanes > 32)
        return md_errf(e, MD_EINVAL, "%s: pcie_gen %d / pcie_lanes %d out of range", where,
                       t->pcie_gen, t->pcie_lanes);
    return 0;
}

static int add_gpu(sched_catalog *c, json_t *g, const char *where, md_err *e) {
    sched_gpu_type t;
    if (parse_gpu(g, &t, where, e))
        return e->code;
    int at = sched_catalog_find(c, t.name);
    if (at < 0) {
        sched_gpu_type *n = realloc(c->gpus, (size_t)(c->n + 1) * sizeof *n);
        if (!n)
            return md_errf(e, MD_ENOMEM, "out of memory growing the GPU catalog");
        c->gpus = n;
        at = c->n++;
    }
    c->gpus[at] = t;
    json_t *al = json_object_get(g, "aliases");
    size_t i;
    json_t *a;
    json_array_foreach(al, i, a) {
        if (json_is_string(a))
            json_object_set_new(c->aliases, json_string_value(a), json_string(t.name));
    }
    return 0;
}

int sched_catalog_from_json(sched_catalog *c, json_t *doc, const char *where, md_err *e) {
    memset(c, 0, sizeof *c);
    c->aliases = json_object();
    if (md_json_check_keys(doc, CATALOG_KEYS, where, e))
        return e->code;
    json_t *gpus = json_object_get(doc, "gpus");
    if (!json_is_array(gpus) || json_array_size(gpus) == 0)
        return md_errf(e, MD_EFORMAT, "%s: \"gpus\" must be a non-empty array", where);
    size_t i;
    json_t *g;
    json_array_foreach(gpus, i, g) {
        char w[128];
        snprintf(w, sizeof w, "%s gpus[%zu]", where, i);
        if (add_gpu(c, g, w, e)) {
            sched_catalog_free(c);
            return e->code;
        }
    }
    return 0;
}

int sched_catalog_load(sched_catalog *c, const char *path, md_err *e) {
    json_t *doc;
    const char *env = getenv("MEDLEY_SCHED_CATALOG");
    if (!path && env && *env)
        path = env;
    if (path) {
        doc = sched_json_load(path, e);
        if (!doc)
            return e->code;
    } else {
        json_error_t je;
        doc = json_loads((const char *)sched_catalog_json, 0, &je);
        if (!doc)
            return md_errf(e, MD_EFORMAT, "built-in GPU catalog: %s (line %d)", je.text, je.line);
    }
    int rc = sched_catalog_from_json(c, doc, path ? path : "built-in GPU catalog", e);
    json_decref(doc);
    return rc;
}

void sched_catalog_free(sched_catalog *c) {
    free(c->gpus);
    json_decref(c->aliases);
    memset(c, 0, sizeof *c);
}

/* Upper case, vendor words dropped, runs of spaces/underscores as one '-'. */
static void norm_device(const char *in, char *out, size_t n) {
    static const char *const drop[] = {"NVIDIA ", "Tesla ", "GeForce ", "Quadro "};
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < sizeof drop / sizeof *drop; i++)
            if (!strncasecmp(in, drop[i], strlen(drop[i]))) {
                in += strlen(drop[i]);
                again = 1;
            }
    }
    size_t k = 0;
    for (; *in && k + 1 < n; in++) {
        char ch = *in == ' ' || *in == '_' ? '-' : (char)toupper((unsigned char)*in);
        if (ch == '-' && (k == 0 || out[k - 1] == '-'))
            continue;
        out[k++] = ch;
    }
    while (k > 0 && out[k - 1] == '-')
        k--;
    out[k] = 0;
}

/* word (of '-'-separated words) occurs in s as whole words */
static int has_words(const char *s, const char *word) {
    size_t n = strlen(word);
    for (const char *p = s; (p = strstr(p, word)); p++)
        if ((p == s || p[-1] == '-') && (p[n] == 0 || p[n] == '-'))
            return 1;
    return 0;
}

int sched_catalog_match_device(const sched_catalog *c, const char *device_name, double memory_gb) {
    if (!device_name || !*device_name)
        return -1;
    char nm[256];
    norm_device(device_name, nm, sizeof nm);
    int at = sched_catalog_find(c, nm);
    if (at >= 0)
        return at;
    int pcie = has_words(nm, "PCIE"), best = -1;
    double best_score = 1e300;
    for (int i = 0; i < c->n; i++) {
        /* the model: the type's name up to its first '-', two words for RTX-<number> */
        char model[SCHED_NAME];
        norm_device(c->gpus[i].name, model, sizeof model);
        char *dash = strchr(model, '-');
        if (dash && !strncmp(model, "RTX-", 4))
            dash = strchr(dash + 1, '-');
        if (dash)
            *dash = 0;
        if (!has_words(nm, model))
            continue;
        double score = memory_gb > 0 ? fabs(c->gpus[i].memory_gb - memory_gb) : 0;
        if (pcie != (strstr(c->gpus[i].name, "PCIe") != NULL))
            score += 1000; /* the form factor first, then memory */
        if (score < best_score) {
            best_score = score;
            best = i;
        }
    }
    return best;
}

int sched_catalog_unmatched_words(const sched_catalog *c, int t, const char *device_name, char *out,
                                  size_t n) {
    /* words of a driver's name that say nothing about the card's kind */
    static const char *const neutral[] = {"SXM",   "SXM2", "SXM4",  "SXM5",      "HBM2",
                                          "HBM2E", "HBM3", "HBM3E", "GENERATION"};
    char nm[256], ty[SCHED_NAME];
    norm_device(device_name ? device_name : "", nm, sizeof nm);
    norm_device(c->gpus[t].name, ty, sizeof ty);
    size_t k = 0;
    int words = 0;
    out[0] = 0;
    char *save = NULL;
    for (char *w = strtok_r(nm, "-", &save); w; w = strtok_r(NULL, "-", &save)) {
        int skip = has_words(ty, w);
        for (size_t i = 0; !skip && i < sizeof neutral / sizeof *neutral; i++)
            skip = !strcmp(w, neutral[i]);
        char *end;
        double gb = strtod(w, &end);
        if (!skip && end != w && !strcmp(end, "GB")) /* "80GB": the memory, as sold (GiB) */
            skip = fabs(gb * 1.073741824 - c->gpus[t].memory_gb) <= 0.1 * c->gpus[t].memory_gb;
        if (skip)
            continue;
        words++;
        if (k < n)
            k += (size_t)snprintf(out + k, n - k, "%s%s", k ? " " : "", w);
    }
    return words;
}

int sched_catalog_find(const sched_catalog *c, const char *name) {
    if (!name)
        return -1;
    for (int i = 0; i < c->n; i++)
        if (!strcasecmp(c->gpus[i].name, name))
            return i;
    const char *k;
    json_t *v;
    json_object_foreach(c->aliases, k, v) {
        if (!strcasecmp(k, name))
            for (int i = 0; i < c->n; i++)
                if (!strcmp(c->gpus[i].name, json_string_value(v)))
                    return i;
    }
    return -1;
}

double sched_gpu_link_gbps(const sched_gpu_type *g) {
    if (g->nvlink_gbps > 0)
        return g->nvlink_gbps / 2; /* datasheets quote both directions */
    /* PCIe per lane per direction: gen3 ~0.985 GB/s, doubling each generation. */
    double lane = 0.985;
    for (int i = 3; i < g->pcie_gen; i++)
        lane *= 2;
    for (int i = g->pcie_gen; i < 3; i++)
        lane /= 2;
    return lane * g->pcie_lanes;
}

static void known_types(const sched_catalog *c, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n && at + 1 < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? ", " : "", c->gpus[i].name);
}

/* Does the fleet's "prices" map name catalog type t (by name or alias)? */
static int price_named(json_t *prices, const sched_catalog *cat, int t) {
    const char *k;
    json_t *v;
    json_object_foreach(prices, k, v) {
        if (sched_catalog_find(cat, k) == t)
            return 1;
    }
    return 0;
}

/* The fleet's name and its links between hosts (bandwidth, latency). */
static int fleet_links(sched_fleet *f, json_t *doc, md_err *e) {
    /* 100 GbE through the kernel's TCP stack: 10-30 us one way (docs/scheduler.md §2). */
    double lat_us = 15;
    const char *name = "fleet";
    if (md_json_get_str(doc, "name", 0, &name, "fleet", e))
        return e->code;
    snprintf(f->name, sizeof f->name, "%s", name);
    if (md_json_get_num(doc, "inter_host_gbps", 0, &f->link_gbps, "fleet", e))
        return e->code;
    if (!(f->link_gbps > 0 && f->link_gbps <= 1e6))
        return md_errf(e, MD_EINVAL, "fleet.inter_host_gbps must be in (0, 1e6]");
    if (md_json_get_num(doc, "inter_host_latency_us", 0, &lat_us, "fleet", e))
        return e->code;
    if (!(lat_us >= 0 && lat_us <= 1e6))
        return md_errf(e, MD_EINVAL, "fleet.inter_host_latency_us must be in [0, 1e6], got %g",
                       lat_us);
    f->link_latency_s = lat_us * 1e-6;
    return 0;
}

/* The fleet's own GPU types (added to cat) and prices (set in cat). */
static int fleet_types_and_prices(json_t *doc, sched_catalog *cat, md_err *e) {
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(doc, "gpu_types"), i, g) {
        char w[64];
        snprintf(w, sizeof w, "fleet.gpu_types[%zu]", i);
        if (add_gpu(cat, g, w, e))
            return e->code;
    }
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(doc, "prices"), k, v) {
        int t = sched_catalog_find(cat, k);
        if (t < 0 || !json_is_number(v) || !(json_number_value(v) >= 0) ||
            json_number_value(v) > 1e5) {
            char known[1024];
            known_types(cat, known, sizeof known);
            return md_errf(e, MD_EINVAL, "fleet.prices.%s: %s (known GPU types: %s)", k,
                           t < 0 ? "unknown GPU type" : "price must be a number in [0, 1e5] $/h",
                           known);
        }
        cat->gpus[t].usd_per_hour = json_number_value(v);
    }
    return 0;
}

/* A rent fleet: one pool of max_per_type (or its rent.max cap) GPUs per type to rent. */
static int fleet_rent(sched_fleet *f, json_t *rent, json_t *priced, sched_catalog *cat, md_err *e) {
    f->rent = 1;
    long long maxn = 64;
    if (md_json_get_int(rent, "max_per_type", 0, &maxn, "fleet.rent", e))
        return e->code;
    if (maxn < 1 || maxn > 100000)
        return md_errf(e, MD_EINVAL, "fleet.rent.max_per_type must be in [1, 100000], got %lld",
                       maxn);
    json_t *types = json_object_get(rent, "types");
    int all = !types;
    int n = all ? cat->n : (int)json_array_size(types);
    if (n == 0)
        return md_errf(e, MD_EINVAL, "fleet.rent.types is empty");
    f->pools = calloc((size_t)n, sizeof *f->pools);
    if (!f->pools)
        return md_errf(e, MD_ENOMEM, "out of memory");
    for (int j = 0; j < n; j++) {
        int t = j;
        if (!all) {
            const char *tn = json_string_value(json_array_get(types, (size_t)j));
            t = sched_catalog_find(cat, tn);
            if (t < 0) {
                char known[1024];
                known_types(cat, known, sizeof known);
                sched_fleet_free(f);
                return md_errf(e, MD_ENOTFOUND,
                               "fleet.rent.types[%d]: unknown GPU type '%s' (known: %s)", j,
                               tn ? tn : "(not a string)", known);
            }
        }
        sched_pool *p = &f->pools[f->n++];
        snprintf(p->name, sizeof p->name, "%s", cat->gpus[t].name);
        p->type = t;
        p->count = (int)maxn;
        p->gpus_per_host = 8;
        p->memory_gb = cat->gpus[t].memory_gb;
        p->usd_per_hour = cat->gpus[t].usd_per_hour;
        snprintf(p->price_from, sizeof p->price_from, "%s",
                 price_named(priced, cat, t) ? "fleet" : "catalog");
    }
    /* Per-type caps ("only 8 A100s to be had this hour") override max_per_type. */
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(rent, "max"), k, v) {
        int t = sched_catalog_find(cat, k), at = -1;
        for (int j = 0; j < f->n && t >= 0; j++)
            if (f->pools[j].type == t)
                at = j;
        if (at < 0 || !json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > 100000) {
            sched_fleet_free(f);
            return md_errf(e, MD_EINVAL, "fleet.rent.max.%s: %s", k,
                           at < 0 ? "not one of the types to rent"
                                  : "must be an integer in [0, 100000]");
        }
        f->pools[at].count = (int)json_integer_value(v);
    }
    return 0;
}

/* Pool i of a fixed fleet (g) into f->pools[f->n], checked (f->n is the caller's to bump). */
/* names: the pool names taken so far (a JSON object used as a hash set: the check was a
 * scan of every earlier pool, quadratic, 10 s at 40,000 pools). */
/* A pool's "usd_per_core_hour" (CPU types: the catalog's cores x it per device-hour), into
 * p->usd_per_hour. 0, or MD_EINVAL naming `where` (a type without cores, a bad price). */
static int pool_core_price(json_t *g, sched_pool *p, const sched_catalog *cat, const char *where,
                           md_err *e) {
    json_t *v = json_object_get(g, "usd_per_core_hour");
    if (!v)
        return 0;
    const sched_gpu_type *t = &cat->gpus[p->type];
    if (t->cores < 1)
        return md_errf(e, MD_EINVAL,
                       "%s.usd_per_core_hour: type %s has no cores in the catalog (GPUs are "
                       "priced per device: usd_per_hour)",
                       where, t->name);
    if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1e3))
        return md_errf(e, MD_EINVAL, "%s.usd_per_core_hour must be a number in [0, 1e3]", where);
    p->usd_per_hour = t->cores * json_number_value(v);
    return 0;
}

static int fleet_pool(sched_fleet *f, json_t *g, size_t i, json_t *priced, json_t *names,
                      sched_catalog *cat, md_err *e) {
    char w[64];
    snprintf(w, sizeof w, "fleet.pools[%zu]", i);
    const char *tn = NULL, *pn = NULL;
    long long count = 0, per = 8;
    if (md_json_check_keys(g, POOL_KEYS, w, e) || md_json_get_str(g, "type", 1, &tn, w, e) ||
        md_json_get_int(g, "count", 1, &count, w, e) ||
        md_json_get_int(g, "gpus_per_host", 0, &per, w, e) ||
        md_json_get_str(g, "name", 0, &pn, w, e))
        return e->code;
    int t = sched_catalog_find(cat, tn);
    if (t < 0) {
        char known[1024];
        known_types(cat, known, sizeof known);
        return md_errf(e, MD_ENOTFOUND,
                       "%s.type: unknown GPU type '%s' (known: %s; a fleet may add types under "
                       "\"gpu_types\")",
                       w, tn, known);
    }
    if (count < 1 || count > 1000000 || per < 1 || per > 64)
        return md_errf(e, MD_EINVAL,
                       "%s: count must be in [1, 1e6] and gpus_per_host in [1, 64] (got %lld, "
                       "%lld)",
                       w, count, per);
    sched_pool *p = &f->pools[f->n];
    p->type = t;
    p->count = (int)count;
    p->gpus_per_host = (int)per;
    p->memory_gb = cat->gpus[t].memory_gb;
    if (md_json_get_num(g, "memory_gb", 0, &p->memory_gb, w, e))
        return e->code;
    if (!(p->memory_gb >= 0.1 && p->memory_gb <= 1e5))
        return md_errf(e, MD_EINVAL, "%s.memory_gb must be in [0.1, 1e5] (GB per device), got %g",
                       w, p->memory_gb);
    p->usd_per_hour = cat->gpus[t].usd_per_hour;
    if (md_json_get_num(g, "usd_per_hour", 0, &p->usd_per_hour, w, e) ||
        pool_core_price(g, p, cat, w, e))
        return e->code;
    snprintf(p->price_from, sizeof p->price_from, "%s",
             json_object_get(g, "usd_per_hour") || json_object_get(g, "usd_per_core_hour") ||
                     price_named(priced, cat, t)
                 ? "fleet"
                 : "catalog");
    if (!(p->usd_per_hour >= 0 && p->usd_per_hour <= 1e5))
        return md_errf(e, MD_EINVAL, "%s.usd_per_hour must be in [0, 1e5], got %g", w,
                       p->usd_per_hour);
    if (pn && sched_check_pool_name(pn, w, e))
        return e->code;
    if (pn)
        snprintf(p->name, sizeof p->name, "%s", pn);
    else
        snprintf(p->name, sizeof p->name, "%s-%zu", cat->gpus[t].name, i);
    if (json_object_get(names, p->name))
        return md_errf(e, MD_EINVAL, "%s.name '%s' is used twice", w, p->name);
    if (json_object_set_new(names, p->name, json_true()))
        return md_errf(e, MD_ENOMEM, "out of memory");
    return 0;
}

/* A fixed fleet: its pools. */
static int fleet_pools(sched_fleet *f, json_t *pools, json_t *priced, sched_catalog *cat,
                       md_err *e) {
    if (!json_is_array(pools) || json_array_size(pools) == 0)
        return md_errf(e, MD_EFORMAT,
                       "fleet: \"pools\" must be a non-empty array of {type, count} (or give "
                       "\"rent\")");
    f->pools = calloc(json_array_size(pools), sizeof *f->pools);
    if (!f->pools)
        return md_errf(e, MD_ENOMEM, "out of memory");
    json_t *names = json_object();
    if (!names) {
        sched_fleet_free(f);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    size_t i;
    json_t *g;
    json_array_foreach(pools, i, g) {
        if (fleet_pool(f, g, i, priced, names, cat, e)) {
            json_decref(names);
            sched_fleet_free(f);
            return e->code;
        }
        f->n++;
    }
    json_decref(names);
    return 0;
}

int sched_fleet_from_json(sched_fleet *f, json_t *doc, sched_catalog *cat, md_err *e) {
    memset(f, 0, sizeof *f);
    f->link_gbps = 12.5;
    if (!json_is_object(doc))
        return md_errf(e, MD_EFORMAT, "fleet: the document must be a JSON object");
    if (md_json_check_keys(doc, FLEET_KEYS, "fleet", e) ||
        md_json_check_keys(json_object_get(doc, "rent"), RENT_KEYS, "fleet.rent", e))
        return e->code;
    if (fleet_links(f, doc, e) || fleet_types_and_prices(doc, cat, e))
        return e->code;
    json_t *priced = json_object_get(doc, "prices"); /* types the fleet prices itself */
    json_t *rent = json_object_get(doc, "rent");
    json_t *pools = json_object_get(doc, "pools");
    if (rent && pools)
        return md_errf(e, MD_EINVAL,
                       "fleet: give either \"pools\" (a fixed fleet) or \"rent\" "
                       "(GPU types to rent), not both");
    return rent ? fleet_rent(f, rent, priced, cat, e) : fleet_pools(f, pools, priced, cat, e);
}

int sched_fleet_load(sched_fleet *f, const char *path, sched_catalog *cat, md_err *e) {
    json_t *doc = sched_json_load(path, e);
    if (!doc)
        return e->code;
    int rc = sched_fleet_from_json(f, doc, cat, e);
    json_decref(doc);
    if (rc)
        md_errctx(e, "%s: ", path);
    return rc;
}

void sched_fleet_free(sched_fleet *f) {
    for (int i = 0; i < f->n; i++)
        free(f->pools[i].hosts);
    free(f->pools);
    memset(f, 0, sizeof *f);
}

json_t *sched_json_load(const char *path, md_err *e) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        md_errf(e, MD_EFORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    return j;
}

int sched_check_pool_name(const char *name, const char *where, md_err *e) {
    size_t n = strlen(name);
    if (n == 0 || n > SCHED_NAME_MAX)
        return md_errf(e, MD_EINVAL, "%s.name must be 1..%d characters (got %zu)", where,
                       SCHED_NAME_MAX, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '/')
            return md_errf(e, MD_EINVAL,
                           "%s.name '%s': '/' at character %zu is not allowed (it ends the name "
                           "in a GPU id \"<name>/<k>\")",
                           where, name, i + 1);
        if (c < 0x20 || c == 0x7f)
            return md_errf(e, MD_EINVAL,
                           "%s.name: control character 0x%02x at character %zu is not allowed",
                           where, c, i + 1);
    }
    return 0;
}

int sched_fleet_gpus(const sched_fleet *f) {
    int n = 0;
    for (int i = 0; i < f->n; i++)
        n += f->pools[i].count;
    return n;
}
