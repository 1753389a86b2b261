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
    uint32_t *acc; /* [nwords] tokens accepted from the node whatever its caller, or NULL */
    int32_t *accl; /* the same as a list when short (fewer tokens than acc has words) */
    int naccl;
    int32_t *unc;  /* uncertain tokens, in trie order */
    uint16_t *lcp; /* bytes each shares with the previous uncertain token */
    int nunc;
} gr_nentry;

/* The OR of several nodes' dense bitsets, for a state that stands on all of them (any JSON
 * value may start: object, array, string, number and literal nodes at once). */
typedef struct {
    uint32_t hash;
    int n;
    int32_t *nodes; /* sorted */
    uint32_t *bits;
} gr_combo;

#define COMBO_SLOTS 512

struct gr_cache {
    uint64_t vocab_uid;
    int nwords;
    _Atomic(gr_nentry *) *ent;              /* [n_nodes] */
    _Atomic(gr_combo *) combo[COMBO_SLOTS]; /* set once, never replaced */
    int ncombo;                             /* under the grammar's lock */
    gr_cache *next;
};

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

/* ---- matcher ----------------------------------------------------------------------------- */

typedef struct {
    int32_t node, parent;
} gr_ent;

typedef struct {
    uint64_t *key;
    int32_t *id;
    uint8_t *vis;
    int32_t *used;
    int nused, cap;
} htab;

#define DF_END 1
#define DF_ESC 2
#define DF_ALIVE 4
#define DFA_MEMO 16384 /* states whose transitions are memoized (256 x 4 bytes each) */

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
    htab h;  /* per step: (node, parent) -> entry, visited */
    htab hc; /* per walk while hc_on: hash-consing, so equal stacks get equal ids */
    int hc_on;
    /* per walk: a DFA over stack sets, built lazily (walk_trie) */
    int32_t *dpool; /* sorted entry ids of each state */
    int ndpool, cdpool;
    int32_t *doff, *dlen;
    uint8_t *dflag; /* DF_END, DF_ESC, DF_ALIVE */
    uint32_t *dhash;
    gr_cls *dposs;  /* bytes some stack of the state can take */
    int32_t *dslot; /* the state's slot in dtab (clearing dtab costs states, not capacity) */
    int ddead;      /* the empty state */
    int nds, cds;
    int32_t *dtab; /* open addressing: hash -> state */
    int dtcap;
    int32_t *dtrans; /* [min(nds, DFA_MEMO) * 256]: next state, -1 unknown */
    int ctrans;
    int32_t *dst; /* state per depth */
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

static void h_clear(htab *h) {
    for (int i = 0; i < h->nused; i++)
        h->key[h->used[i]] = UINT64_MAX;
    h->nused = 0;
}

static int h_rehash(gr_matcher *m, htab *h, int ncap) {
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

static void h_free(htab *h) {
    free(h->key);
    free(h->id);
    free(h->vis);
    free(h->used);
}

/* Slot of (node, parent), created empty (id -1, not visited) when absent; -1 on OOM. */
static int h_slot(gr_matcher *m, htab *h, int32_t node, int32_t parent) {
    if (h->nused * 2 >= h->cap && h_rehash(m, h, h->cap * 2))
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

static int32_t ent_new(gr_matcher *m, int32_t node, int32_t parent) {
    if (mgrow(m, (void **)&m->ar, &m->car, m->nar + 1, sizeof *m->ar))
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
                m->hc.id[c] = ent_new(m, node, parent);
            m->h.id[s] = m->hc.id[c];
        } else
            m->h.id[s] = ent_new(m, node, parent);
    }
    *slot = s;
    return m->h.id[s];
}

static void work_push(gr_matcher *m, int32_t id) {
    if (mgrow(m, (void **)&m->work, &m->cwork, m->nwork + 1, sizeof *m->work))
        return;
    m->work[m->nwork++] = id;
}

/* Visit stack id (entry created in this step or older) unless already visited. */
static void visit(gr_matcher *m, int32_t id) {
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
    h_clear(&m->h);
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
        h_clear(&m->h);
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

static void isort(int32_t *x, int n) {
    for (int i = 1; i < n; i++) {
        int32_t v = x[i];
        int j = i - 1;
        while (j >= 0 && x[j] > v) {
            x[j + 1] = x[j];
            j--;
        }
        x[j + 1] = v;
    }
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
    if (mgrow(m, (void **)&m->dpool, &m->cdpool, m->ndpool + len + 1, sizeof *m->dpool))
        return -1;
    int cds = m->cds;
    if (mgrow(m, (void **)&m->doff, &cds, s + 1, sizeof *m->doff))
        return -1;
    cds = m->cds;
    if (mgrow(m, (void **)&m->dlen, &cds, s + 1, sizeof *m->dlen))
        return -1;
    cds = m->cds;
    if (mgrow(m, (void **)&m->dflag, &cds, s + 1, sizeof *m->dflag))
        return -1;
    cds = m->cds;
    if (mgrow(m, (void **)&m->dhash, &cds, s + 1, sizeof *m->dhash))
        return -1;
    cds = m->cds;
    if (mgrow(m, (void **)&m->dposs, &cds, s + 1, sizeof *m->dposs))
        return -1;
    cds = m->cds;
    if (mgrow(m, (void **)&m->dslot, &cds, s + 1, sizeof *m->dslot))
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
        if (mgrow(m, (void **)&m->dtrans, &m->ctrans, (s + 1) * 256, sizeof *m->dtrans))
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
    if (mgrow(m, (void **)&m->sets, &m->csets, base + len + 1, sizeof *m->sets))
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
    h_clear(&m->hc);
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
    h_clear(&m->hc);
}

/* Where a walk puts the tokens it accepts: a list while short, then a bitset. */
typedef struct {
    uint32_t *bits; /* [words], or NULL while listing */
    int32_t *list;
    int n, cap, words;
    int fail;
} gr_sink;

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
static void walk_trie(gr_matcher *m, const gr_cls *follow, gr_sink *acc, int32_t **unc, int *nunc,
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
    if (!m->c || !m->nmark || !m->nlist || h_rehash(m, &m->h, 1024) || h_rehash(m, &m->hc, 1024) ||
        ensure_depth(m, v->maxlen + 1)) {
        gr_matcher_free(m);
        return md_errf(e, MD_ENOMEM, "out of memory creating a grammar matcher");
    }
    /* Initial state: the closure of the root rule's start over BOTTOM. */
    h_clear(&m->h);
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
    h_free(&m->h);
    h_free(&m->hc);
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
    walk_init(m, n);
    walk_trie(m, &m->g->follow[m->g->rule_of[n]], &acc, &ne->unc, &ne->nunc, &cunc);
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

/* Several dense nodes: copy their OR from the combo table, adding it there on first sight.
 * Returns 1 when mask holds the OR. nlist[0..nn) is sorted here. */
static int combo_fill(gr_matcher *m, int nn, uint32_t *mask, int words) {
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
    walk_init(m, -1);
    gr_sink sk = {mask, NULL, 0, 0, words, 0};
    walk_trie(m, NULL, &sk, NULL, NULL, NULL);
    m->nar = keep;
    if (m->end)
        for (int i = 0; i < m->v->neos; i++)
            set_bit(mask, m->v->eos[i]);
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
        gr_nentry *ne = entry_of(m, m->nlist[i]);
        if (!ne) {
            /* Out of memory for the cache: the exact walk still gives the right mask. */
            gr_matcher_fill_mask_slow(m, mask);
            return;
        }
        ndense += ne->acc != NULL;
    }
    if (ndense > 1 && combo_fill(m, nn, mask, words))
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
    walk_init(m, -1);
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

int gr_prepare(const gr_grammar *g, const gr_vocab *v, md_err *e) {
    gr_matcher *m;
    int rc = gr_matcher_new(g, v, &m, e);
    if (rc)
        return rc;
    for (int n = 0; n < g->n_nodes && !rc; n++)
        if (g->has_bytes[n] && !entry_of(m, n))
            rc = md_errf(e, MD_ENOMEM, "out of memory computing the token-mask cache");
    gr_matcher_free(m);
    return rc;
}
