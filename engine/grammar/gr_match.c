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

#include "engine/grammar/grammar_int.h"

#define P_BOTTOM (-1)
#define P_ESC (-2)

/* ---- vocabulary ------------------------------------------------------------------------ */

struct gr_vocab {
    int n;
    uint64_t uid; /* caches are keyed by this, not by the address (which can be reused) */
    char *bytes;
    uint32_t *off, *len; /* [n] */
    uint8_t *is_eos;     /* [n] */
    int32_t *eos;        /* the distinct end tokens */
    int neos;
    int maxlen;
    /* trie in preorder: node k at depth tn_depth[k] (1-based) with byte tn_byte[k]; its
     * subtree ends before tn_end[k]; tokens ending at k are toks[tn_tok[k] .. tn_tok[k+1]) */
    int ntn;
    uint8_t *tn_byte;
    int32_t *tn_depth, *tn_end, *tn_tok;
    int32_t *toks;
    int ntoks;
};

static _Atomic uint64_t vocab_uid_next = 1;

static const gr_vocab *sort_vocab;
static int cmp_tok(const void *a, const void *b) {
    const gr_vocab *v = sort_vocab;
    int x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

int gr_vocab_new(int n_vocab, const char *const *tok, const uint32_t *len, const int32_t *eos,
                 int n_eos, gr_vocab **out, md_err *e) {
    *out = NULL;
    if (n_vocab <= 0 || !tok || !len || (n_eos > 0 && !eos) || n_eos < 0)
        return md_errf(e, MD_EINVAL, "gr_vocab_new: need n_vocab > 0, tok[], len[] and eos[]");
    gr_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    v->n = n_vocab;
    v->uid = atomic_fetch_add(&vocab_uid_next, 1);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (len[i] && !tok[i]) {
            free(v);
            return md_errf(e, MD_EINVAL, "gr_vocab_new: token %d has %u bytes but no data", i,
                           len[i]);
        }
        total += len[i];
    }
    v->bytes = malloc(total + 1);
    v->off = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    v->len = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    v->is_eos = calloc((size_t)n_vocab, 1);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!v->bytes || !v->off || !v->len || !v->is_eos || !ids || total > UINT32_MAX) {
        free(ids);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    v->eos = malloc(sizeof(int32_t) * (size_t)(n_eos + 1));
    if (!v->eos) {
        free(ids);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            free(ids);
            gr_vocab_free(v);
            return md_errf(e, MD_EINVAL, "gr_vocab_new: end token %d outside 0..%d", eos[i],
                           n_vocab - 1);
        }
        if (!v->is_eos[eos[i]])
            v->eos[v->neos++] = eos[i];
        v->is_eos[eos[i]] = 1;
    }
    size_t o = 0;
    int nt = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)o;
        v->len[i] = v->is_eos[i] ? 0 : len[i];
        if (v->len[i]) {
            memcpy(v->bytes + o, tok[i], len[i]);
            ids[nt++] = i;
            if ((int)len[i] > v->maxlen)
                v->maxlen = (int)len[i];
        }
        o += v->len[i];
    }
    pthread_mutex_lock(&sort_lock);
    sort_vocab = v;
    qsort(ids, (size_t)nt, sizeof *ids, cmp_tok);
    pthread_mutex_unlock(&sort_lock);
    /* Trie nodes: at most total bytes. */
    size_t cap = total + 1;
    v->tn_byte = malloc(cap);
    v->tn_depth = malloc(sizeof(int32_t) * cap);
    v->tn_end = malloc(sizeof(int32_t) * cap);
    v->tn_tok = malloc(sizeof(int32_t) * (cap + 1));
    v->toks = malloc(sizeof(int32_t) * ((size_t)nt + 1));
    int32_t *open = malloc(sizeof(int32_t) * ((size_t)v->maxlen + 2));
    if (!v->tn_byte || !v->tn_depth || !v->tn_end || !v->tn_tok || !v->toks || !open) {
        free(ids);
        free(open);
        gr_vocab_free(v);
        return md_errf(e, MD_ENOMEM, "out of memory building a grammar vocabulary");
    }
    int depth_open = 0; /* open[1..depth_open] are the nodes on the current path */
    int prev = -1;
    for (int i = 0; i < nt; i++) {
        int id = ids[i];
        const uint8_t *s = (const uint8_t *)v->bytes + v->off[id];
        int l = (int)v->len[id];
        int lcp = 0;
        if (prev >= 0) {
            const uint8_t *p = (const uint8_t *)v->bytes + v->off[prev];
            int pl = (int)v->len[prev];
            while (lcp < l && lcp < pl && p[lcp] == s[lcp])
                lcp++;
        }
        /* Close the nodes deeper than the shared prefix. */
        while (depth_open > lcp) {
            v->tn_end[open[depth_open]] = v->ntn;
            depth_open--;
        }
        for (int d = lcp + 1; d <= l; d++) {
            int k = v->ntn++;
            v->tn_byte[k] = s[d - 1];
            v->tn_depth[k] = d;
            v->tn_tok[k] = v->ntoks;
            open[d] = k;
            depth_open = d;
        }
        v->toks[v->ntoks++] = id;
        prev = id;
    }
    while (depth_open > 0) {
        v->tn_end[open[depth_open]] = v->ntn;
        depth_open--;
    }
    v->tn_tok[v->ntn] = v->ntoks;
    free(open);
    free(ids);
    *out = v;
    return 0;
}

void gr_vocab_free(gr_vocab *v) {
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->is_eos);
    free(v->eos);
    free(v->tn_byte);
    free(v->tn_depth);
    free(v->tn_end);
    free(v->tn_tok);
    free(v->toks);
    free(v);
}

int gr_vocab_size(const gr_vocab *v) {
    return v ? v->n : 0;
}

/* ---- per (grammar, vocabulary) mask cache ------------------------------------------------ */

typedef struct {
    uint32_t *acc; /* [nwords] tokens accepted from the node whatever its caller */
    int32_t *unc;  /* uncertain tokens, in trie order */
    uint16_t *lcp; /* bytes each shares with the previous uncertain token */
    int nunc;
} gr_nentry;

struct gr_cache {
    uint64_t vocab_uid;
    int nwords;
    _Atomic(gr_nentry *) *ent; /* [n_nodes] */
    gr_cache *next;
};

static void nentry_free(gr_nentry *n) {
    if (!n)
        return;
    free(n->acc);
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
        free(c->ent);
        free(c);
        c = nx;
    }
    g->caches = NULL;
}

/* ---- matcher ----------------------------------------------------------------------------- */

typedef struct {
    int32_t node, parent;
} gr_ent;

struct gr_matcher {
    const gr_grammar *g;
    const gr_vocab *v;
    gr_cache *c;
    gr_ent *ar; /* stack entries; ids index it */
    int nar, car;
    int32_t *cur; /* ready stacks of the current state */
    int ncur, ccur;
    int end;  /* the root rule may end here */
    int done; /* an end token was accepted */
    /* scratch: concatenated sets per depth of a walk */
    int32_t *sets;
    int nsets, csets;
    int32_t *d_off, *d_len, *d_mark;
    uint8_t *d_end, *d_esc, *d_escany;
    int dcap;
    /* per-step hash (node, parent) -> slot; slots hold id and visited */
    uint64_t *hkey;
    int32_t *hid;
    uint8_t *hvis;
    int32_t *hused;
    int nhused, hcap;
    int32_t *work;
    int nwork, cwork;
    uint32_t *nmark; /* [n_nodes] epoch marks */
    uint32_t epoch;
    int32_t *nlist;
    int oom; /* a scratch buffer could not grow: the last walk is incomplete */
};

static int mgrow(gr_matcher *m, void **p, int *cap, int need, size_t elem) {
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

static void h_clear(gr_matcher *m) {
    for (int i = 0; i < m->nhused; i++)
        m->hkey[m->hused[i]] = UINT64_MAX;
    m->nhused = 0;
}

static int h_rehash(gr_matcher *m, int ncap) {
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
    for (int i = 0; i < m->nhused; i++) {
        int s = m->hused[i];
        uint64_t k = m->hkey[s];
        uint64_t h = (k * 0x9E3779B97F4A7C15ull) >> 20;
        int j = (int)(h & (uint64_t)(ncap - 1));
        while (nk[j] != UINT64_MAX)
            j = (j + 1) & (ncap - 1);
        nk[j] = k;
        ni[j] = m->hid[s];
        nv[j] = m->hvis[s];
        nu[nused++] = j;
    }
    free(m->hkey);
    free(m->hid);
    free(m->hvis);
    free(m->hused);
    m->hkey = nk;
    m->hid = ni;
    m->hvis = nv;
    m->hused = nu;
    m->hcap = ncap;
    return 0;
}

/* Slot of (node, parent), created empty (id -1, not visited) when absent; -1 on OOM. */
static int h_slot(gr_matcher *m, int32_t node, int32_t parent) {
    if (m->nhused * 2 >= m->hcap && h_rehash(m, m->hcap * 2))
        return -1;
    uint64_t k = hkey_of(node, parent);
    uint64_t h = (k * 0x9E3779B97F4A7C15ull) >> 20;
    int j = (int)(h & (uint64_t)(m->hcap - 1));
    while (m->hkey[j] != UINT64_MAX) {
        if (m->hkey[j] == k)
            return j;
        j = (j + 1) & (m->hcap - 1);
    }
    m->hkey[j] = k;
    m->hid[j] = -1;
    m->hvis[j] = 0;
    m->hused[m->nhused++] = j;
    return j;
}

static int32_t ent_new(gr_matcher *m, int32_t node, int32_t parent) {
    if (mgrow(m, (void **)&m->ar, &m->car, m->nar + 1, sizeof *m->ar))
        return -1;
    m->ar[m->nar] = (gr_ent){node, parent};
    return m->nar++;
}

/* The entry for (node, parent) in this step, created when new. */
static int32_t ent_get(gr_matcher *m, int32_t node, int32_t parent, int *slot) {
    int s = h_slot(m, node, parent);
    if (s < 0)
        return -1;
    if (m->hid[s] < 0)
        m->hid[s] = ent_new(m, node, parent);
    *slot = s;
    return m->hid[s];
}

static void work_push(gr_matcher *m, int32_t id) {
    if (mgrow(m, (void **)&m->work, &m->cwork, m->nwork + 1, sizeof *m->work))
        return;
    m->work[m->nwork++] = id;
}

/* Visit stack id (entry created in this step or older) unless already visited. */
static void visit(gr_matcher *m, int32_t id) {
    int s = h_slot(m, m->ar[id].node, m->ar[id].parent);
    if (s < 0)
        return;
    if (m->hid[s] < 0)
        m->hid[s] = id;
    if (m->hvis[s])
        return;
    m->hvis[s] = 1;
    work_push(m, id);
}

/* Close the work list: append ready stacks to m->sets, set *end / *esc. */
static void closure(gr_matcher *m, uint8_t *end, uint8_t *esc) {
    const gr_grammar *g = m->g;
    while (m->nwork) {
        int32_t s = m->work[--m->nwork];
        int32_t n = m->ar[s].node, p = m->ar[s].parent;
        if (g->has_bytes[n]) {
            if (mgrow(m, (void **)&m->sets, &m->csets, m->nsets + 1, sizeof *m->sets))
                return;
            m->sets[m->nsets++] = s;
        }
        if (g->final[n]) {
            if (p == P_BOTTOM)
                *end = 1;
            else if (p == P_ESC)
                *esc = 1;
            else
                visit(m, p);
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
            if (!m->hvis[sl]) {
                m->hvis[sl] = 1;
                work_push(m, top);
            }
        }
    }
}

/* Advance the set sets[off .. off+len) by byte b; the result is appended to m->sets.
 * Returns the result's offset; its length is m->nsets - offset. */
static int advance(gr_matcher *m, int off, int len, unsigned b, uint8_t *end, uint8_t *esc) {
    const gr_grammar *g = m->g;
    h_clear(m);
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
            if (!m->hvis[sl]) {
                m->hvis[sl] = 1;
                work_push(m, t);
            }
        }
    }
    closure(m, end, esc);
    return out;
}

/* Depth scratch for walks of up to maxd bytes. */
static int ensure_depth(gr_matcher *m, int maxd) {
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
    if (!a || !b || !c || !d || !f || !h) {
        m->oom = 1;
        return -1;
    }
    m->dcap = n;
    return 0;
}

/* Depth 0 of a walk: the current state, or the closure of (node, ESC) when node >= 0. */
static void walk_init(gr_matcher *m, int node) {
    m->nsets = 0;
    m->d_off[0] = 0;
    if (node < 0) {
        if (m->ncur && mgrow(m, (void **)&m->sets, &m->csets, m->ncur, sizeof *m->sets) == 0) {
            memcpy(m->sets, m->cur, sizeof(int32_t) * (size_t)m->ncur);
            m->nsets = m->ncur;
        }
        m->d_end[0] = (uint8_t)m->end;
        m->d_esc[0] = 0;
    } else {
        h_clear(m);
        m->nwork = 0;
        int32_t id = ent_new(m, node, P_ESC);
        if (id >= 0)
            visit(m, id);
        m->d_end[0] = m->d_esc[0] = 0;
        closure(m, &m->d_end[0], &m->d_esc[0]);
    }
    m->d_len[0] = m->nsets;
    m->d_escany[0] = m->d_esc[0];
    m->d_mark[0] = m->nar;
}

static void set_bit(uint32_t *mask, int t) {
    mask[t >> 5] |= 1u << (t & 31);
}
static int get_bit(const uint32_t *mask, int t) {
    return (mask[t >> 5] >> (t & 31)) & 1;
}

/* Walk the whole trie from depth 0 (walk_init): accepted tokens set in acc; when unc is
 * non-NULL, tokens that die after a point where the rule could have returned to its unknown
 * caller are appended to *unc (trie order). */
static void walk_trie(gr_matcher *m, uint32_t *acc, int32_t **unc, int *nunc, int *cunc) {
    const gr_vocab *v = m->v;
    int k = 0;
    while (k < v->ntn && !m->oom) {
        int d = v->tn_depth[k];
        /* Drop what deeper walks left behind: depth d-1 is the parent state. */
        m->nar = m->d_mark[d - 1];
        m->nsets = m->d_off[d - 1] + m->d_len[d - 1];
        uint8_t end = 0, esc = 0;
        int alive;
        if (m->d_len[d - 1] == 0) {
            alive = 0;
            m->d_off[d] = m->nsets;
            m->d_len[d] = 0;
        } else {
            int o = advance(m, m->d_off[d - 1], m->d_len[d - 1], v->tn_byte[k], &end, &esc);
            m->d_off[d] = o;
            m->d_len[d] = m->nsets - o;
            alive = m->d_len[d] > 0 || end || esc;
        }
        if (!alive) {
            if (unc && m->d_escany[d - 1]) {
                int lo = v->tn_tok[k], hi = v->tn_tok[v->tn_end[k]];
                if (hi > lo && *nunc + (hi - lo) > *cunc) {
                    int nc = *cunc ? *cunc : 64;
                    while (nc < *nunc + (hi - lo))
                        nc *= 2;
                    int32_t *q = realloc(*unc, sizeof(int32_t) * (size_t)nc);
                    if (!q) {
                        m->oom = 1;
                        return;
                    }
                    *unc = q;
                    *cunc = nc;
                }
                for (int i = lo; i < hi; i++)
                    (*unc)[(*nunc)++] = v->toks[i];
            }
            k = v->tn_end[k];
            continue;
        }
        m->d_end[d] = end;
        m->d_esc[d] = esc;
        m->d_escany[d] = (uint8_t)(m->d_escany[d - 1] | esc);
        m->d_mark[d] = m->nar;
        for (int i = v->tn_tok[k]; i < v->tn_tok[k + 1]; i++)
            set_bit(acc, v->toks[i]);
        k++;
    }
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
    if (!m->c || !m->nmark || !m->nlist || h_rehash(m, 1024) || ensure_depth(m, v->maxlen + 1)) {
        gr_matcher_free(m);
        return md_errf(e, MD_ENOMEM, "out of memory creating a grammar matcher");
    }
    /* Initial state: the closure of the root rule's start over BOTTOM. */
    h_clear(m);
    m->nwork = 0;
    m->nsets = 0;
    int32_t id = ent_new(m, g->rule_start[g->root], P_BOTTOM);
    if (id >= 0)
        visit(m, id);
    uint8_t end = 0, esc = 0;
    closure(m, &end, &esc);
    if (m->oom || mgrow(m, (void **)&m->cur, &m->ccur, m->nsets + 1, sizeof *m->cur)) {
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
    free(m->hkey);
    free(m->hid);
    free(m->hvis);
    free(m->hused);
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
    if (!ne || !(ne->acc = calloc((size_t)words, sizeof(uint32_t)))) {
        free(ne);
        return NULL;
    }
    int cunc = 0;
    m->oom = 0;
    walk_init(m, n);
    walk_trie(m, ne->acc, &ne->unc, &ne->nunc, &cunc);
    m->nar = keep;
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

static gr_nentry *entry_of(gr_matcher *m, int n) {
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

/* The mask by walking the whole trie from the current state (no cache): the reference the
 * cached path is tested against. */
void gr_matcher_fill_mask_slow(gr_matcher *m, uint32_t *mask) {
    int words = (m->v->n + 31) / 32;
    memset(mask, 0, sizeof(uint32_t) * (size_t)words);
    if (m->done)
        return;
    int keep = m->nar;
    m->oom = 0;
    walk_init(m, -1);
    walk_trie(m, mask, NULL, NULL, NULL);
    m->nar = keep;
    if (m->end)
        for (int i = 0; i < m->v->neos; i++)
            set_bit(mask, m->v->eos[i]);
}

void gr_matcher_fill_mask(gr_matcher *m, uint32_t *mask) {
    const gr_vocab *v = m->v;
    int words = (v->n + 31) / 32;
    memset(mask, 0, sizeof(uint32_t) * (size_t)words);
    if (m->done)
        return;
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
    for (int i = 0; i < nn; i++) {
        gr_nentry *ne = entry_of(m, m->nlist[i]);
        if (!ne) {
            /* Out of memory for the cache: the exact walk still gives the right mask. */
            gr_matcher_fill_mask_slow(m, mask);
            return;
        }
        const uint32_t *a = ne->acc;
        for (int w = 0; w < words; w++)
            mask[w] |= a[w];
    }
    /* Uncertain tokens: run each from the real stacks, sharing prefixes in trie order. */
    m->oom = 0;
    walk_init(m, -1);
    for (int i = 0; i < nn; i++) {
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
            int ok = 1;
            for (int d = valid + 1; d <= l; d++) {
                if (!run_bytes(m, s, d, d - 1)) {
                    ok = 0;
                    dead = d;
                    valid = d - 1;
                    break;
                }
                valid = d;
            }
            if (ok)
                set_bit(mask, t);
        }
    }
    m->nar = keep;
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
    walk_init(m, -1);
    if (!run_bytes(m, (const uint8_t *)v->bytes + v->off[token], l, 0) ||
        mgrow(m, (void **)&m->cur, &m->ccur, m->d_len[l] + 1, sizeof *m->cur)) {
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
    if (ensure_depth(m, (int)n + 1))
        return MD_ENOMEM;
    int keep = m->nar;
    m->oom = 0;
    walk_init(m, -1);
    if (n && (!run_bytes(m, (const uint8_t *)s, (int)n, 0) ||
              mgrow(m, (void **)&m->cur, &m->ccur, m->d_len[n] + 1, sizeof *m->cur))) {
        m->nar = keep;
        ensure_depth(m, m->v->maxlen + 1);
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
