/* gr_match.c — vocabularies, matchers and token masks.
 *
 * A matcher's state is a set of parser stacks over the grammar's rule automata (a pushdown
 * automaton run on all branches at once). A stack is an entry (node, parent) in the
 * matcher's arena: node is the position in the innermost rule, parent the entry of the
 * calling frame (its node is the return position), BOTTOM under the root rule. The state
 * keeps only "ready" stacks, whose node has a byte edge, plus a flag for "the root rule may
 * end here". Advancing by a byte moves each ready stack along its matching byte edges and
 * closes the result: calls are expanded (a frame pushed per call edge) and final nodes
 * return to their caller.
 *
 * Masks. The vocabulary is a trie of token byte strings in preorder (sorted, so shared
 * prefixes are walked once and each subtree is a contiguous run). For each node that a ready
 * stack can sit on, a per-(grammar, vocabulary) cache holds the tokens accepted from that
 * node whatever lies below it on the stack (a trie walk from the node over an unknown
 * caller, ESC), and the "uncertain" tokens that leave the node's rule with bytes left over.
 * A mask is the union of the accepted sets of the state's ready nodes, plus each uncertain
 * token checked against the full stacks (few: those that close a rule mid-token, like `",`).
 * Cache entries are computed on first use, under the grammar's lock. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_match_int.h"

/* ---- matcher ----------------------------------------------------------------------------- */

int gm_mgrow(gr_matcher *m, void **p, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 256;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) {
        m->oom = 1;
        return -1;
    }
    *p = q;
    *cap = nc;
    return 0;
}

static uint64_t hkey_of(int32_t node, int32_t parent) {
    return ((uint64_t)(uint32_t)node << 32) | (uint32_t)parent;
}

void gm_h_clear(htab *h) {
    for (int i = 0; i < h->nused; i++)
        h->key[h->used[i]] = UINT64_MAX;
    h->nused = 0;
}

int gm_h_rehash(gr_matcher *m, htab *h, int ncap) {
    uint64_t *nk = malloc(sizeof(uint64_t) * (size_t)ncap);
    int32_t *ni = malloc(sizeof(int32_t) * (size_t)ncap);
    uint8_t *nv = malloc((size_t)ncap);
    int32_t *nu = malloc(sizeof(int32_t) * (size_t)ncap);
    if (!nk || !ni || !nv || !nu) {
        free(nk);
        free(ni);
        free(nv);
        free(nu);
        m->oom = 1;
        return -1;
    }
    memset(nk, 0xff, sizeof(uint64_t) * (size_t)ncap);
    int nused = 0;
    for (int i = 0; i < h->nused; i++) {
        int s = h->used[i];
        uint64_t k = h->key[s];
        uint64_t hh = (k * 0x9E3779B97F4A7C15ull) >> 20;
        int j = (int)(hh & (uint64_t)(ncap - 1));
        while (nk[j] != UINT64_MAX)
            j = (j + 1) & (ncap - 1);
        nk[j] = k;
        ni[j] = h->id[s];
        nv[j] = h->vis[s];
        nu[nused++] = j;
    }
    free(h->key);
    free(h->id);
    free(h->vis);
    free(h->used);
    h->key = nk;
    h->id = ni;
    h->vis = nv;
    h->used = nu;
    h->cap = ncap;
    return 0;
}

void gm_h_free(htab *h) {
    free(h->key);
    free(h->id);
    free(h->vis);
    free(h->used);
}

/* Slot of (node, parent), created empty (id -1, not visited) when absent; -1 on OOM. */
static int h_slot(gr_matcher *m, htab *h, int32_t node, int32_t parent) {
    if (h->nused * 2 >= h->cap && gm_h_rehash(m, h, h->cap * 2))
        return -1;
    uint64_t k = hkey_of(node, parent);
    uint64_t hh = (k * 0x9E3779B97F4A7C15ull) >> 20;
    int j = (int)(hh & (uint64_t)(h->cap - 1));
    while (h->key[j] != UINT64_MAX) {
        if (h->key[j] == k)
            return j;
        j = (j + 1) & (h->cap - 1);
    }
    h->key[j] = k;
    h->id[j] = -1;
    h->vis[j] = 0;
    h->used[h->nused++] = j;
    return j;
}

int32_t gm_ent_new(gr_matcher *m, int32_t node, int32_t parent) {
    if (gm_mgrow(m, (void **)&m->ar, &m->car, m->nar + 1, sizeof *m->ar))
        return -1;
    m->ar[m->nar] = (gr_ent){node, parent};
    return m->nar++;
}

/* The entry for (node, parent) in this step, created when new. */
static int32_t ent_get(gr_matcher *m, int32_t node, int32_t parent, int *slot) {
    int s = h_slot(m, &m->h, node, parent);
    if (s < 0)
        return -1;
    if (m->h.id[s] < 0) {
        if (m->hc_on) {
            int c = h_slot(m, &m->hc, node, parent);
            if (c < 0)
                return -1;
            if (m->hc.id[c] < 0)
                m->hc.id[c] = gm_ent_new(m, node, parent);
            m->h.id[s] = m->hc.id[c];
        } else
            m->h.id[s] = gm_ent_new(m, node, parent);
    }
    *slot = s;
    return m->h.id[s];
}

static void work_push(gr_matcher *m, int32_t id) {
    if (gm_mgrow(m, (void **)&m->work, &m->cwork, m->nwork + 1, sizeof *m->work))
        return;
    m->work[m->nwork++] = id;
}

/* Visit stack id (entry created in this step or older) unless already visited. */
void gm_visit(gr_matcher *m, int32_t id) {
    int s = h_slot(m, &m->h, m->ar[id].node, m->ar[id].parent);
    if (s < 0)
        return;
    if (m->h.id[s] < 0)
        m->h.id[s] = id;
    if (m->h.vis[s])
        return;
    m->h.vis[s] = 1;
    work_push(m, id);
}

/* Close the work list: append ready stacks to m->sets, set *end / *esc. */
void gm_closure(gr_matcher *m, uint8_t *end, uint8_t *esc) {
    const gr_grammar *g = m->g;
    while (m->nwork) {
        int32_t s = m->work[--m->nwork];
        int32_t n = m->ar[s].node, p = m->ar[s].parent;
        if (g->has_bytes[n]) {
            if (gm_mgrow(m, (void **)&m->sets, &m->csets, m->nsets + 1, sizeof *m->sets))
                return;
            m->sets[m->nsets++] = s;
        }
        if (g->final[n]) {
            if (p == P_BOTTOM)
                *end = 1;
            else if (p == P_ESC)
                *esc = 1;
            else
                gm_visit(m, p);
        }
        for (int k = g->edge_off[n]; k < g->edge_off[n + 1]; k++) {
            const gr_edge *ed = &g->edges[k];
            if (ed->kind != GE_CALL)
                continue;
            int sl;
            int32_t q = ent_get(m, ed->target, p, &sl);
            if (q < 0)
                return;
            int32_t top = ent_get(m, g->rule_start[ed->label], q, &sl);
            if (top < 0)
                return;
            if (!m->h.vis[sl]) {
                m->h.vis[sl] = 1;
                work_push(m, top);
            }
        }
    }
}

/* Advance the set sets[off .. off+len) by byte b; the result is appended to m->sets.
 * Returns the result's offset; its length is m->nsets - offset. */
static int advance(gr_matcher *m, int off, int len, unsigned b, uint8_t *end, uint8_t *esc) {
    const gr_grammar *g = m->g;
    gm_h_clear(&m->h);
    m->nwork = 0;
    *end = 0;
    *esc = 0;
    int out = m->nsets;
    for (int i = 0; i < len; i++) {
        int32_t s = m->sets[off + i];
        int32_t n = m->ar[s].node, p = m->ar[s].parent;
        for (int k = g->edge_off[n]; k < g->edge_off[n + 1]; k++) {
            const gr_edge *ed = &g->edges[k];
            if (ed->kind != GE_BYTES || !gr_cls_has(&g->cls[ed->label], b))
                continue;
            int sl;
            int32_t t = ent_get(m, ed->target, p, &sl);
            if (t < 0)
                return out;
            if (!m->h.vis[sl]) {
                m->h.vis[sl] = 1;
                work_push(m, t);
            }
        }
    }
    gm_closure(m, end, esc);
    return out;
}

/* Depth scratch for walks of up to maxd bytes. */
int gm_ensure_depth(gr_matcher *m, int maxd) {
    if (maxd + 2 <= m->dcap)
        return 0;
    int n = maxd + 2;
    int32_t *a = realloc(m->d_off, sizeof(int32_t) * (size_t)n);
    if (a)
        m->d_off = a;
    int32_t *b = realloc(m->d_len, sizeof(int32_t) * (size_t)n);
    if (b)
        m->d_len = b;
    int32_t *c = realloc(m->d_mark, sizeof(int32_t) * (size_t)n);
    if (c)
        m->d_mark = c;
    uint8_t *d = realloc(m->d_end, (size_t)n);
    if (d)
        m->d_end = d;
    uint8_t *f = realloc(m->d_esc, (size_t)n);
    if (f)
        m->d_esc = f;
    uint8_t *h = realloc(m->d_escany, (size_t)n);
    if (h)
        m->d_escany = h;
    int32_t *st = realloc(m->dst, sizeof(int32_t) * (size_t)n);
    if (st)
        m->dst = st;
    if (!a || !b || !c || !d || !f || !h || !st) {
        m->oom = 1;
        return -1;
    }
    m->dcap = n;
    return 0;
}

/* Depth 0 of a walk: the current state, or the closure of (node, ESC) when node >= 0. */
void gm_walk_init(gr_matcher *m, int node) {
    m->nsets = 0;
    m->d_off[0] = 0;
    if (node < 0) {
        if (m->ncur && gm_mgrow(m, (void **)&m->sets, &m->csets, m->ncur, sizeof *m->sets) == 0) {
            memcpy(m->sets, m->cur, sizeof(int32_t) * (size_t)m->ncur);
            m->nsets = m->ncur;
        }
        m->d_end[0] = (uint8_t)m->end;
        m->d_esc[0] = 0;
    } else {
        gm_h_clear(&m->h);
        m->nwork = 0;
        int32_t id = gm_ent_new(m, node, P_ESC);
        if (id >= 0)
            gm_visit(m, id);
        m->d_end[0] = m->d_esc[0] = 0;
        gm_closure(m, &m->d_end[0], &m->d_esc[0]);
    }
    m->d_len[0] = m->nsets;
    m->d_escany[0] = m->d_esc[0];
    m->d_mark[0] = m->nar;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int dfa_rehash(gr_matcher *m, int ncap) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)ncap);
    if (!t) {
        m->oom = 1;
        return -1;
    }
    memset(t, 0xff, sizeof(int32_t) * (size_t)ncap);
    for (int s = 0; s < m->nds; s++) {
        int j = (int)(m->dhash[s] & (uint32_t)(ncap - 1));
        while (t[j] >= 0)
            j = (j + 1) & (ncap - 1);
        t[j] = s;
        m->dslot[s] = j;
    }
    free(m->dtab);
    m->dtab = t;
    m->dtcap = ncap;
    return 0;
}

/* The DFA state of the stack set sets[off .. off+len) with its flags (sorted in place);
 * -1 on OOM. Hash-consing makes equal stacks equal ids, so equal sets are one state. */
static int dfa_state(gr_matcher *m, int off, int len, uint8_t end, uint8_t esc) {
    int32_t *x = m->sets + off;
    if (len < 24)
        isort(x, len);
    else
        qsort(x, (size_t)len, sizeof *x, cmp_i32);
    uint8_t fl =
        (uint8_t)((end ? DF_END : 0) | (esc ? DF_ESC : 0) | (len || end || esc ? DF_ALIVE : 0));
    uint32_t h = 2166136261u ^ fl;
    for (int i = 0; i < len; i++)
        h = (h ^ (uint32_t)x[i]) * 16777619u;
    if (m->nds * 2 >= m->dtcap && dfa_rehash(m, m->dtcap ? m->dtcap * 2 : 1024))
        return -1;
    int j = (int)(h & (uint32_t)(m->dtcap - 1));
    while (m->dtab[j] >= 0) {
        int s = m->dtab[j];
        if (m->dhash[s] == h && m->dflag[s] == fl && m->dlen[s] == len &&
            !memcmp(m->dpool + m->doff[s], x, sizeof(int32_t) * (size_t)len))
            return s;
        j = (j + 1) & (m->dtcap - 1);
    }
    int s = m->nds;
    if (gm_mgrow(m, (void **)&m->dpool, &m->cdpool, m->ndpool + len + 1, sizeof *m->dpool))
        return -1;
    int cds = m->cds;
    if (gm_mgrow(m, (void **)&m->doff, &cds, s + 1, sizeof *m->doff))
        return -1;
    cds = m->cds;
    if (gm_mgrow(m, (void **)&m->dlen, &cds, s + 1, sizeof *m->dlen))
        return -1;
    cds = m->cds;
    if (gm_mgrow(m, (void **)&m->dflag, &cds, s + 1, sizeof *m->dflag))
        return -1;
    cds = m->cds;
    if (gm_mgrow(m, (void **)&m->dhash, &cds, s + 1, sizeof *m->dhash))
        return -1;
    cds = m->cds;
    if (gm_mgrow(m, (void **)&m->dposs, &cds, s + 1, sizeof *m->dposs))
        return -1;
    cds = m->cds;
    if (gm_mgrow(m, (void **)&m->dslot, &cds, s + 1, sizeof *m->dslot))
        return -1;
    m->cds = cds;
    gr_cls poss = {{0}};
    const gr_grammar *g = m->g;
    for (int i = 0; i < len; i++) {
        int n = m->ar[x[i]].node;
        for (int k = g->edge_off[n]; k < g->edge_off[n + 1]; k++)
            if (g->edges[k].kind == GE_BYTES)
                for (int w = 0; w < 4; w++)
                    poss.w[w] |= g->cls[g->edges[k].label].w[w];
    }
    m->dposs[s] = poss;
    if (s < DFA_MEMO) {
        if (gm_mgrow(m, (void **)&m->dtrans, &m->ctrans, (s + 1) * 256, sizeof *m->dtrans))
            return -1;
        memset(m->dtrans + (size_t)s * 256, 0xff, 256 * sizeof *m->dtrans);
    }
    if (len)
        memcpy(m->dpool + m->ndpool, x, sizeof(int32_t) * (size_t)len);
    m->doff[s] = m->ndpool;
    m->dlen[s] = len;
    m->dflag[s] = fl;
    m->dhash[s] = h;
    m->ndpool += len;
    m->dtab[j] = s;
    m->dslot[s] = j;
    m->nds++;
    return s;
}

/* The state after byte b from state s (memoized for the first DFA_MEMO states). */
static int dfa_next(gr_matcher *m, int s, unsigned b) {
    if (!gr_cls_has(&m->dposs[s], b))
        return m->ddead; /* no stack takes b: nothing to compute */
    if (s < DFA_MEMO) {
        int t = m->dtrans[(size_t)s * 256 + b];
        if (t >= 0)
            return t;
    }
    int base = m->nsets, len = m->dlen[s];
    if (gm_mgrow(m, (void **)&m->sets, &m->csets, base + len + 1, sizeof *m->sets))
        return -1;
    if (len)
        memcpy(m->sets + base, m->dpool + m->doff[s], sizeof(int32_t) * (size_t)len);
    m->nsets = base + len;
    uint8_t end = 0, esc = 0;
    int o = len ? advance(m, base, len, b, &end, &esc) : m->nsets;
    int t = m->oom ? -1 : dfa_state(m, o, m->nsets - o, end, esc);
    m->nsets = base;
    if (t >= 0 && s < DFA_MEMO)
        m->dtrans[(size_t)s * 256 + b] = t;
    return t;
}

static int add_unc(gr_matcher *m, const gr_vocab *v, int k, int32_t **unc, int *nunc, int *cunc) {
    int lo = v->tn_tok[k], hi = v->tn_tok[v->tn_end[k]];
    if (hi > lo && *nunc + (hi - lo) > *cunc) {
        int nc = *cunc ? *cunc : 64;
        while (nc < *nunc + (hi - lo))
            nc *= 2;
        int32_t *q = realloc(*unc, sizeof(int32_t) * (size_t)nc);
        if (!q) {
            m->oom = 1;
            return -1;
        }
        *unc = q;
        *cunc = nc;
    }
    for (int i = lo; i < hi; i++)
        (*unc)[(*nunc)++] = v->toks[i];
    return 0;
}

/* Start a DFA over stack sets from depth 0 (walk_init): dst[0] is its first state.
 * 0, or -1 on OOM. */
static int dfa_begin(gr_matcher *m) {
    for (int s = 0; s < m->nds; s++)
        m->dtab[m->dslot[s]] = -1;
    m->nds = 0;
    m->ndpool = 0;
    gm_h_clear(&m->hc);
    m->hc_on = 1;
    int s0 = dfa_state(m, 0, m->d_len[0], m->d_end[0], m->d_esc[0]);
    m->nsets = m->d_len[0];
    m->ddead = dfa_state(m, m->nsets, 0, 0, 0);
    if (s0 < 0 || m->ddead < 0)
        return -1;
    m->dst[0] = s0;
    return 0;
}

static void dfa_end(gr_matcher *m) {
    m->hc_on = 0;
    gm_h_clear(&m->hc);
}

static void sink_add(gr_sink *k, int32_t t) {
    if (k->bits) {
        set_bit(k->bits, t);
        return;
    }
    if (k->n == k->cap) {
        if (k->n >= k->words) { /* long: switch to the bitset */
            k->bits = calloc((size_t)k->words, sizeof(uint32_t));
            if (!k->bits) {
                k->fail = 1;
                return;
            }
            for (int i = 0; i < k->n; i++)
                set_bit(k->bits, k->list[i]);
            free(k->list);
            k->list = NULL;
            k->n = 0;
            set_bit(k->bits, t);
            return;
        }
        int nc = k->cap ? k->cap * 2 : 64;
        if (nc > k->words + 1)
            nc = k->words + 1;
        int32_t *q = realloc(k->list, sizeof(int32_t) * (size_t)nc);
        if (!q) {
            k->fail = 1;
            return;
        }
        k->list = q;
        k->cap = nc;
    }
    k->list[k->n++] = t;
}

/* Walk the whole trie from depth 0 (walk_init): accepted tokens set in acc; when unc is
 * non-NULL, tokens that die after a point where the rule could have returned to its unknown
 * caller are appended to *unc (trie order). The stack sets met on the way become states of
 * a DFA whose transitions are memoized, so a trie node usually costs one table lookup. */
void gm_walk_trie(gr_matcher *m, const gr_cls *follow, gr_sink *acc, int32_t **unc, int *nunc,
                  int *cunc) {
    const gr_vocab *v = m->v;
    if (dfa_begin(m))
        goto out;
    m->d_escany[0] = 0;
    int k = 0;
    while (k < v->ntn && !m->oom) {
        int d = v->tn_depth[k];
        int s = m->dst[d - 1];
        unsigned b = v->tn_byte[k];
        /* The node's rule may have returned before this byte, and a caller may go on with
         * it: what follows is uncertain. */
        uint8_t escany = (uint8_t)(m->d_escany[d - 1] ||
                                   (follow && (m->dflag[s] & DF_ESC) && gr_cls_has(follow, b)));
        int t = dfa_next(m, s, b);
        if (t < 0)
            break;
        if (!(m->dflag[t] & DF_ALIVE)) {
            if (unc && escany && add_unc(m, v, k, unc, nunc, cunc))
                break;
            k = v->tn_end[k];
            continue;
        }
        m->dst[d] = t;
        m->d_escany[d] = escany;
        for (int i = v->tn_tok[k]; i < v->tn_tok[k + 1]; i++)
            sink_add(acc, v->toks[i]);
        if (acc->fail)
            m->oom = 1;
        k++;
    }
out:
    dfa_end(m);
}

/* Run token bytes s[0..l) from depth 0 starting at depth `from` (states up to from are
 * valid). Returns 1 when the token is accepted; depth l then holds the state. */
static int run_bytes(gr_matcher *m, const uint8_t *s, int l, int from) {
    for (int d = from + 1; d <= l; d++) {
        m->nar = m->d_mark[d - 1];
        m->nsets = m->d_off[d - 1] + m->d_len[d - 1];
        if (m->d_len[d - 1] == 0)
            return 0;
        uint8_t end = 0, esc = 0;
        int o = advance(m, m->d_off[d - 1], m->d_len[d - 1], s[d - 1], &end, &esc);
        m->d_off[d] = o;
        m->d_len[d] = m->nsets - o;
        m->d_end[d] = end;
        m->d_mark[d] = m->nar;
        if (m->oom || (m->d_len[d] == 0 && !end))
            return 0;
    }
    return 1;
}

void gr_matcher_fill_mask(gr_matcher *m, uint32_t *mask) {
    const gr_vocab *v = m->v;
    int words = (v->n + 31) / 32;
    if (m->done) {
        memset(mask, 0, sizeof(uint32_t) * (size_t)words);
        return;
    }
    int keep = m->nar;
    if (++m->epoch == 0) {
        memset(m->nmark, 0, sizeof(uint32_t) * (size_t)m->g->n_nodes);
        m->epoch = 1;
    }
    int nn = 0;
    for (int i = 0; i < m->ncur; i++) {
        int n = m->ar[m->cur[i]].node;
        if (m->nmark[n] == m->epoch)
            continue;
        m->nmark[n] = m->epoch;
        m->nlist[nn++] = n;
    }
    int dense = 0, ndense = 0;
    for (int i = 0; i < nn; i++) {
        gr_nentry *ne = gm_entry_of(m, m->nlist[i]);
        if (!ne) {
            /* Out of memory for the cache: the exact walk still gives the right mask. */
            gr_matcher_fill_mask_slow(m, mask);
            return;
        }
        ndense += ne->acc != NULL;
    }
    if (ndense > 1 && gm_combo_fill(m, nn, mask, words))
        dense = 1;
    for (int i = 0; i < nn && !dense; i++) {
        const uint32_t *a =
            atomic_load_explicit(&m->c->ent[m->nlist[i]], memory_order_acquire)->acc;
        if (!a)
            continue;
        if (!dense)
            memcpy(mask, a, sizeof(uint32_t) * (size_t)words);
        else
            for (int w = 0; w < words; w++)
                mask[w] |= a[w];
        dense = 1;
    }
    if (!dense)
        memset(mask, 0, sizeof(uint32_t) * (size_t)words);
    for (int i = 0; i < nn; i++) {
        gr_nentry *ne = atomic_load_explicit(&m->c->ent[m->nlist[i]], memory_order_acquire);
        for (int j = 0; j < ne->naccl; j++)
            set_bit(mask, ne->accl[j]);
    }
    /* Uncertain tokens: run each from the real stacks, sharing prefixes in trie order, through
     * a DFA over stack sets started on the first one (tokens like `":"`, `":{"`, `":["`
     * then share their transitions). */
    m->oom = 0;
    gm_walk_init(m, -1);
    int started = 0;
    for (int i = 0; i < nn && !m->oom; i++) {
        gr_nentry *ne = atomic_load_explicit(&m->c->ent[m->nlist[i]], memory_order_acquire);
        int valid = 0; /* depths 0..valid hold the prefix of the previous token */
        int dead = -1; /* the previous token died at this depth */
        for (int j = 0; j < ne->nunc; j++) {
            int t = ne->unc[j];
            int l = (int)v->len[t];
            int lcp = ne->lcp[j];
            if (valid > lcp)
                valid = lcp;
            if (dead >= 0 && lcp >= dead)
                continue; /* shares the prefix that died */
            dead = -1;
            if (get_bit(mask, t)) {
                continue;
            }
            const uint8_t *s = (const uint8_t *)v->bytes + v->off[t];
            if (!started) {
                if (dfa_begin(m))
                    break;
                started = 1;
            }
            int ok = 1;
            for (int d = valid + 1; d <= l; d++) {
                int st = dfa_next(m, m->dst[d - 1], s[d - 1]);
                if (st < 0 || !(m->dflag[st] & DF_ALIVE)) {
                    ok = 0;
                    dead = d;
                    valid = d - 1;
                    break;
                }
                m->dst[d] = st;
                valid = d;
            }
            if (ok)
                set_bit(mask, t);
        }
    }
    if (started)
        dfa_end(m);
    m->nar = keep;
    if (m->oom) { /* a scratch buffer could not grow: the exact walk instead */
        gr_matcher_fill_mask_slow(m, mask);
        return;
    }
    if (m->end)
        for (int i = 0; i < v->neos; i++)
            set_bit(mask, v->eos[i]);
}

int gr_matcher_accept(gr_matcher *m, int32_t token) {
    const gr_vocab *v = m->v;
    if (token < 0 || token >= v->n || m->done)
        return MD_EINVAL;
    if (v->is_eos[token]) {
        if (!m->end)
            return MD_EINVAL;
        m->done = 1;
        return 0;
    }
    int l = (int)v->len[token];
    if (l == 0)
        return MD_EINVAL;
    int keep = m->nar;
    m->oom = 0;
    gm_walk_init(m, -1);
    if (!run_bytes(m, (const uint8_t *)v->bytes + v->off[token], l, 0) ||
        gm_mgrow(m, (void **)&m->cur, &m->ccur, m->d_len[l] + 1, sizeof *m->cur)) {
        m->nar = keep;
        return MD_EINVAL;
    }
    if (m->d_len[l])
        memcpy(m->cur, m->sets + m->d_off[l], sizeof(int32_t) * (size_t)m->d_len[l]);
    m->ncur = m->d_len[l];
    m->end = m->d_end[l];
    return 0;
}

int gr_matcher_can_end(const gr_matcher *m) {
    return m->end && !m->done;
}

int gr_matcher_must_end(const gr_matcher *m) {
    return m->ncur == 0 && m->end && !m->done;
}

/* Accept raw bytes (tests and validation: does the grammar accept this text?). */
int gr_matcher_accept_bytes(gr_matcher *m, const char *s, size_t n) {
    if (m->done)
        return MD_EINVAL;
    if (gm_ensure_depth(m, (int)n + 1))
        return MD_ENOMEM;
    int keep = m->nar;
    m->oom = 0;
    gm_walk_init(m, -1);
    if (n && (!run_bytes(m, (const uint8_t *)s, (int)n, 0) ||
              gm_mgrow(m, (void **)&m->cur, &m->ccur, m->d_len[n] + 1, sizeof *m->cur))) {
        m->nar = keep;
        gm_ensure_depth(m, m->v->maxlen + 1);
        return MD_EINVAL;
    }
    if (n) {
        if (m->d_len[n])
            memcpy(m->cur, m->sets + m->d_off[n], sizeof(int32_t) * (size_t)m->d_len[n]);
        m->ncur = m->d_len[n];
        m->end = m->d_end[n];
    }
    return 0;
}
