/* gr_mask.c — the per-(grammar, vocabulary) mask cache: for each node, the tokens accepted
 * from it whatever its caller and the uncertain ones, computed on first use under the
 * grammar's lock; dense unions of several nodes; matchers made and freed against it; the
 * slow reference mask and gr_prepare. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_match_int.h"

static void nentry_free(gr_nentry *n) {
    if (!n)
        return;
    free(n->acc);
    free(n->accl);
    free(n->unc);
    free(n->lcp);
    free(n);
}

void gr_cache_free_all(gr_grammar *g) {
    gr_cache *c = g->caches;
    while (c) {
        gr_cache *nx = c->next;
        for (int i = 0; i < g->n_nodes; i++)
            nentry_free(atomic_load(&c->ent[i]));
        for (int i = 0; i < COMBO_SLOTS; i++) {
            gr_combo *x = atomic_load(&c->combo[i]);
            if (x) {
                free(x->nodes);
                free(x->bits);
                free(x);
            }
        }
        free(c->ent);
        free(c);
        c = nx;
    }
    g->caches = NULL;
}

static gr_cache *cache_get(gr_grammar *g, const gr_vocab *v) {
    pthread_mutex_lock(&g->lock);
    gr_cache *c = g->caches;
    while (c && c->vocab_uid != v->uid)
        c = c->next;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c) {
            c->ent = calloc((size_t)g->n_nodes + 1, sizeof *c->ent);
            if (!c->ent) {
                free(c);
                c = NULL;
            } else {
                c->vocab_uid = v->uid;
                c->nwords = (v->n + 31) / 32;
                c->next = g->caches;
                g->caches = c;
            }
        }
    }
    pthread_mutex_unlock(&g->lock);
    return c;
}

int gr_matcher_new(const gr_grammar *g, const gr_vocab *v, gr_matcher **out, md_err *e) {
    *out = NULL;
    if (!g || !v)
        return md_errf(e, MD_EINVAL, "gr_matcher_new: grammar and vocabulary are required");
    gr_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "out of memory creating a grammar matcher");
    m->g = g;
    m->v = v;
    m->c = cache_get((gr_grammar *)g, v);
    m->nmark = calloc((size_t)g->n_nodes + 1, sizeof *m->nmark);
    m->nlist = malloc(sizeof(int32_t) * ((size_t)g->n_nodes + 1));
    if (!m->c || !m->nmark || !m->nlist || gm_h_rehash(m, &m->h, 1024) ||
        gm_h_rehash(m, &m->hc, 1024) || gm_ensure_depth(m, v->maxlen + 1)) {
        gr_matcher_free(m);
        return md_errf(e, MD_ENOMEM, "out of memory creating a grammar matcher");
    }
    /* Initial state: the closure of the root rule's start over BOTTOM. */
    gm_h_clear(&m->h);
    m->nwork = 0;
    m->nsets = 0;
    int32_t id = gm_ent_new(m, g->rule_start[g->root], P_BOTTOM);
    if (id >= 0)
        gm_visit(m, id);
    uint8_t end = 0, esc = 0;
    gm_closure(m, &end, &esc);
    if (m->oom || gm_mgrow(m, (void **)&m->cur, &m->ccur, m->nsets + 1, sizeof *m->cur)) {
        gr_matcher_free(m);
        return md_errf(e, MD_ENOMEM, "out of memory creating a grammar matcher");
    }
    if (m->nsets)
        memcpy(m->cur, m->sets, sizeof(int32_t) * (size_t)m->nsets);
    m->ncur = m->nsets;
    m->end = end;
    *out = m;
    return 0;
}

void gr_matcher_free(gr_matcher *m) {
    if (!m)
        return;
    free(m->ar);
    free(m->cur);
    free(m->sets);
    free(m->d_off);
    free(m->d_len);
    free(m->d_mark);
    free(m->d_end);
    free(m->d_esc);
    free(m->d_escany);
    gm_h_free(&m->h);
    gm_h_free(&m->hc);
    free(m->dpool);
    free(m->doff);
    free(m->dlen);
    free(m->dflag);
    free(m->dhash);
    free(m->dposs);
    free(m->dslot);
    free(m->dtab);
    free(m->dtrans);
    free(m->dst);
    free(m->work);
    free(m->nmark);
    free(m->nlist);
    free(m);
}

/* Compute the cache entry of node n (walk from (n, ESC)). The matcher's arena above the
 * current state is scratch; it is restored. */
static gr_nentry *entry_compute(gr_matcher *m, int n) {
    int keep = m->nar;
    gr_nentry *ne = calloc(1, sizeof *ne);
    int words = (m->v->n + 31) / 32;
    if (!ne)
        return NULL;
    gr_sink acc = {NULL, NULL, 0, 0, words, 0};
    int cunc = 0;
    m->oom = 0;
    gm_walk_init(m, n);
    gm_walk_trie(m, &m->g->follow[m->g->rule_of[n]], &acc, &ne->unc, &ne->nunc, &cunc);
    m->nar = keep;
    /* Narrow nodes (a literal's next byte) keep a list: cheaper to apply than a bitset. */
    ne->acc = acc.bits;
    ne->accl = acc.list;
    ne->naccl = acc.n;
    if (m->oom) {
        nentry_free(ne);
        return NULL;
    }
    if (ne->nunc) {
        ne->lcp = malloc(sizeof(uint16_t) * (size_t)ne->nunc);
        if (!ne->lcp) {
            nentry_free(ne);
            return NULL;
        }
        const gr_vocab *v = m->v;
        for (int i = 0; i < ne->nunc; i++) {
            int l = 0;
            if (i) {
                int a = ne->unc[i - 1], b = ne->unc[i];
                const char *x = v->bytes + v->off[a], *y = v->bytes + v->off[b];
                int la = (int)v->len[a], lb = (int)v->len[b];
                while (l < la && l < lb && l < 65535 && x[l] == y[l])
                    l++;
            }
            ne->lcp[i] = (uint16_t)l;
        }
    }
    return ne;
}

gr_nentry *gm_entry_of(gr_matcher *m, int n) {
    gr_nentry *ne = atomic_load_explicit(&m->c->ent[n], memory_order_acquire);
    if (ne)
        return ne;
    gr_grammar *g = (gr_grammar *)m->g;
    pthread_mutex_lock(&g->lock);
    ne = atomic_load_explicit(&m->c->ent[n], memory_order_acquire);
    if (!ne) {
        ne = entry_compute(m, n);
        if (ne)
            atomic_store_explicit(&m->c->ent[n], ne, memory_order_release);
    }
    pthread_mutex_unlock(&g->lock);
    return ne;
}

/* Several dense nodes: copy their OR from the combo table, adding it there on first sight.
 * Returns 1 when mask holds the OR. nlist[0..nn) is sorted here. */
int gm_combo_fill(gr_matcher *m, int nn, uint32_t *mask, int words) {
    isort(m->nlist, nn);
    uint32_t h = 2166136261u;
    for (int i = 0; i < nn; i++)
        h = (h ^ (uint32_t)m->nlist[i]) * 16777619u;
    gr_cache *c = m->c;
    for (int p = 0; p < 8; p++) {
        gr_combo *x =
            atomic_load_explicit(&c->combo[(h + (uint32_t)p) % COMBO_SLOTS], memory_order_acquire);
        if (!x)
            break;
        if (x->hash == h && x->n == nn &&
            !memcmp(x->nodes, m->nlist, sizeof(int32_t) * (size_t)nn)) {
            memcpy(mask, x->bits, sizeof(uint32_t) * (size_t)words);
            return 1;
        }
    }
    /* Not there: the OR, then publish it (under the lock) if a probe slot is free. */
    int first = 1;
    for (int i = 0; i < nn; i++) {
        const uint32_t *a = atomic_load_explicit(&c->ent[m->nlist[i]], memory_order_acquire)->acc;
        if (!a)
            continue;
        if (first)
            memcpy(mask, a, sizeof(uint32_t) * (size_t)words);
        else
            for (int w = 0; w < words; w++)
                mask[w] |= a[w];
        first = 0;
    }
    gr_grammar *g = (gr_grammar *)m->g;
    pthread_mutex_lock(&g->lock);
    for (int p = 0; p < 8 && c->ncombo < COMBO_SLOTS / 2; p++) {
        int slot = (int)((h + (uint32_t)p) % COMBO_SLOTS);
        gr_combo *x = atomic_load_explicit(&c->combo[slot], memory_order_acquire);
        if (x && x->hash == h && x->n == nn &&
            !memcmp(x->nodes, m->nlist, sizeof(int32_t) * (size_t)nn))
            break; /* another thread added it */
        if (x)
            continue;
        x = calloc(1, sizeof *x);
        if (x) {
            x->nodes = malloc(sizeof(int32_t) * (size_t)nn);
            x->bits = malloc(sizeof(uint32_t) * (size_t)words);
        }
        if (!x || !x->nodes || !x->bits) {
            if (x) {
                free(x->nodes);
                free(x->bits);
            }
            free(x);
            break;
        }
        x->hash = h;
        x->n = nn;
        memcpy(x->nodes, m->nlist, sizeof(int32_t) * (size_t)nn);
        memcpy(x->bits, mask, sizeof(uint32_t) * (size_t)words);
        atomic_store_explicit(&c->combo[slot], x, memory_order_release);
        c->ncombo++;
        break;
    }
    pthread_mutex_unlock(&g->lock);
    return 1;
}

/* The mask by walking the whole trie from the current state (no cache): the reference the
 * cached path is tested against. */
void gr_matcher_fill_mask_slow(gr_matcher *m, uint32_t *mask) {
    int words = (m->v->n + 31) / 32;
    memset(mask, 0, sizeof(uint32_t) * (size_t)words);
    if (m->done)
        return;
    int keep = m->nar;
    m->oom = 0;
    gm_walk_init(m, -1);
    gr_sink sk = {mask, NULL, 0, 0, words, 0};
    gm_walk_trie(m, NULL, &sk, NULL, NULL, NULL);
    m->nar = keep;
    if (m->end)
        for (int i = 0; i < m->v->neos; i++)
            set_bit(mask, m->v->eos[i]);
}

int gr_prepare(const gr_grammar *g, const gr_vocab *v, md_err *e) {
    gr_matcher *m;
    int rc = gr_matcher_new(g, v, &m, e);
    if (rc)
        return rc;
    for (int n = 0; n < g->n_nodes && !rc; n++)
        if (g->has_bytes[n] && !gm_entry_of(m, n))
            rc = md_errf(e, MD_ENOMEM, "out of memory computing the token-mask cache");
    gr_matcher_free(m);
    return rc;
}
