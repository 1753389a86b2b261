/* gr_compile.c — a builder's rules compiled into the grammar the matcher runs: one
 * epsilon-free NFA per rule (edges: a byte class or a call), rules that can never finish
 * pruned, left recursion refused (the matcher expands calls eagerly, so a rule that can call
 * itself without consuming a byte would never settle), follow sets per rule. */
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar_int.h"

/* ---- Thompson construction per rule ---------------------------------------------------- */

typedef struct {
    int32_t from, to;
    int32_t kind; /* -1 epsilon, GE_BYTES, GE_CALL */
    int32_t label;
} tedge;

typedef struct {
    tedge *e;
    int ne, ce;
    int nstates;
    int failed;
    gr_builder *b;
} thompson;

static int t_state(thompson *t) {
    if (t->nstates >= GR_MAX_STATES) {
        t->failed = 1;
        gb_fail(t->b, MD_ENOMEM, "grammar too large: more than %d automaton states", GR_MAX_STATES);
        return 0;
    }
    return t->nstates++;
}

static void t_edge(thompson *t, int from, int to, int kind, int label) {
    if (t->failed)
        return;
    if (gb_grow((void **)&t->e, &t->ce, t->ne + 1, sizeof *t->e)) {
        t->failed = 1;
        gb_fail(t->b, MD_ENOMEM, "out of memory compiling a grammar");
        return;
    }
    t->e[t->ne++] = (tedge){from, to, kind, label};
}

/* Build expression x between states s and f. Iterative over SEQ chains (which nest deeply on
 * the left for long literals); other nesting is bounded by the front ends' depth limits. */
static void t_build(thompson *t, int x, int s, int f, int depth) {
    if (t->failed)
        return;
    if (depth > 2000) {
        t->failed = 1;
        gb_fail(t->b, MD_EUNSUPP, "grammar nests deeper than 2000 levels");
        return;
    }
    const gr_expr *ex = &t->b->ex[x];
    switch (ex->kind) {
    case GX_EMPTY: t_edge(t, s, f, -1, 0); break;
    case GX_NONE: break;
    case GX_CLS: t_edge(t, s, f, GE_BYTES, ex->a); break;
    case GX_REF: t_edge(t, s, f, GE_CALL, ex->a); break;
    case GX_ALT: {
        /* Long alternations nest on the left (enums, choices): walk the spine. */
        int y = x;
        while (t->b->ex[y].kind == GX_ALT && !t->failed) {
            t_build(t, t->b->ex[y].b, s, f, depth + 1);
            y = t->b->ex[y].a;
        }
        t_build(t, y, s, f, depth + 1);
        break;
    }
    case GX_SEQ: {
        /* Collect the left spine so a literal of a million bytes does not recurse. */
        int n = 0, y = x;
        while (t->b->ex[y].kind == GX_SEQ) {
            n++;
            y = t->b->ex[y].a;
        }
        int *parts = malloc(sizeof(int) * (size_t)(n + 1));
        if (!parts) {
            t->failed = 1;
            gb_fail(t->b, MD_ENOMEM, "out of memory compiling a grammar");
            return;
        }
        parts[0] = y;
        int k = n;
        y = x;
        while (t->b->ex[y].kind == GX_SEQ) {
            parts[k--] = t->b->ex[y].b;
            y = t->b->ex[y].a;
        }
        int cur = s;
        for (int i = 0; i <= n && !t->failed; i++) {
            int nx = i == n ? f : t_state(t);
            t_build(t, parts[i], cur, nx, depth + 1);
            cur = nx;
        }
        free(parts);
        break;
    }
    case GX_REP: {
        int lo = ex->lo, hi = ex->hi, c = ex->a;
        int cur = s;
        for (int i = 0; i < lo && !t->failed; i++) {
            int nx = t_state(t);
            t_build(t, c, cur, nx, depth + 1);
            cur = nx;
        }
        if (hi < 0) {
            /* cur -> loop: c back to loop; loop -> f. */
            int loop = t_state(t);
            t_edge(t, cur, loop, -1, 0);
            int nx = t_state(t);
            t_build(t, c, loop, nx, depth + 1);
            t_edge(t, nx, loop, -1, 0);
            t_edge(t, loop, f, -1, 0);
        } else {
            for (int i = lo; i < hi && !t->failed; i++) {
                t_edge(t, cur, f, -1, 0);
                int nx = i + 1 == hi ? f : t_state(t);
                t_build(t, c, cur, nx, depth + 1);
                cur = nx;
            }
            if (lo == hi)
                t_edge(t, cur, f, -1, 0);
        }
        break;
    }
    }
}

static int cmp_tedge_from(const void *a, const void *b) {
    const tedge *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return (x->to > y->to) - (x->to < y->to);
}

static int cmp_gedge(const void *a, const void *b) {
    const gr_edge *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->label != y->label)
        return x->label < y->label ? -1 : 1;
    return (x->target > y->target) - (x->target < y->target);
}

/* Growing global node table. */
typedef struct {
    gr_edge *edges;
    int nedges, cedges;
    int32_t *off; /* start of each node's edges; filled node by node */
    uint8_t *final;
    int nnodes, cnodes;
    int coff, cfinal;
} gtab;

/* Bytes that can come first from node t (through calls, and nullable calls), OR'ed into
 * *out; 1 when t can also reach its rule's end without a byte. */
static int first_from(const gr_grammar *g, const uint8_t *nullable, int t, gr_cls *out,
                      int32_t *stk, uint8_t *seen, int32_t *touched) {
    int sp = 0, nt = 0, fin = 0;
    stk[sp++] = t;
    seen[t] = 1;
    touched[nt++] = t;
    while (sp) {
        int n = stk[--sp];
        if (g->final[n])
            fin = 1;
        for (int k = g->edge_off[n]; k < g->edge_off[n + 1]; k++) {
            const gr_edge *ed = &g->edges[k];
            const gr_cls *c = ed->kind == GE_BYTES ? &g->cls[ed->label] : &g->first[ed->label];
            for (int w = 0; w < 4; w++)
                out->w[w] |= c->w[w];
            if (ed->kind == GE_CALL && nullable[ed->label] && !seen[ed->target]) {
                seen[ed->target] = 1;
                touched[nt++] = ed->target;
                stk[sp++] = ed->target;
            }
        }
    }
    for (int i = 0; i < nt; i++)
        seen[touched[i]] = 0;
    return fin;
}

/* FIRST and FOLLOW byte sets of every rule (fixpoint): a token that leaves a rule mid-way can
 * only go on with a byte of the rule's FOLLOW, which keeps the mask cache's uncertain lists
 * short (xgrammar gets the same effect from lookahead assertions). */
static int follow_sets(gr_grammar *g, const uint8_t *nullable, const int32_t *rule_of) {
    int nr = g->n_rules, nn = g->n_nodes;
    g->first = calloc((size_t)nr + 1, sizeof(gr_cls));
    g->follow = calloc((size_t)nr + 1, sizeof(gr_cls));
    int32_t *stk = malloc(sizeof(int32_t) * ((size_t)nn + 1));
    int32_t *touched = malloc(sizeof(int32_t) * ((size_t)nn + 1));
    uint8_t *seen = calloc((size_t)nn + 1, 1);
    if (!g->first || !g->follow || !stk || !touched || !seen) {
        free(stk);
        free(touched);
        free(seen);
        return -1;
    }
    for (int changed = 1, it = 0; changed && it < 10000; it++) {
        changed = 0;
        for (int r = 0; r < nr; r++) {
            gr_cls c = g->first[r];
            first_from(g, nullable, g->rule_start[r], &c, stk, seen, touched);
            if (memcmp(&c, &g->first[r], sizeof c)) {
                g->first[r] = c;
                changed = 1;
            }
        }
        for (int u = 0; u < nn; u++)
            for (int k = g->edge_off[u]; k < g->edge_off[u + 1]; k++) {
                const gr_edge *ed = &g->edges[k];
                if (ed->kind != GE_CALL)
                    continue;
                gr_cls c = g->follow[ed->label];
                if (first_from(g, nullable, ed->target, &c, stk, seen, touched)) {
                    const gr_cls *f = &g->follow[rule_of[u]];
                    for (int w = 0; w < 4; w++)
                        c.w[w] |= f->w[w];
                }
                if (memcmp(&c, &g->follow[ed->label], sizeof c)) {
                    g->follow[ed->label] = c;
                    changed = 1;
                }
            }
    }
    free(stk);
    free(touched);
    free(seen);
    return 0;
}

/* Scratch of one rule's NFA while its states are emitted. */
typedef struct {
    thompson t;
    int32_t *map, *stk, *eoff;
    uint8_t *inclos;
    int cmap, cstk, ceoff, cin;
} nfa_scratch;

/* Node `node` of the table from kept state s0: the consuming edges of its epsilon closure
 * (one of each), final when the closure holds the accept state. */
static int emit_state(nfa_scratch *x, gtab *G, int s0, int node, md_err *e) {
    int rc = 0;
    G->off[node] = G->nedges;
    /* Epsilon closure of s0 by DFS; inclos marks are cleared after. */
    int sp = 0, nvis = 0;
    x->stk[sp++] = s0;
    x->inclos[s0] = 1;
    int fin = 0;
    int first_edge = G->nedges;
    while (sp) {
        int s = x->stk[--sp];
        nvis++;
        if (s == 1)
            fin = 1;
        for (int k = x->eoff[s]; k < x->eoff[s + 1]; k++) {
            tedge *te = &x->t.e[k];
            if (te->kind < 0) {
                if (!x->inclos[te->to]) {
                    x->inclos[te->to] = 1;
                    x->stk[sp++] = te->to;
                }
                continue;
            }
            if (gb_grow((void **)&G->edges, &G->cedges, G->nedges + 1, sizeof *G->edges)) {
                rc = md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
                break;
            }
            G->edges[G->nedges++] = (gr_edge){(uint8_t)te->kind, te->label, x->map[te->to]};
        }
        if (rc)
            break;
    }
    (void)nvis;
    G->final[node] = (uint8_t)fin;
    /* Several closure states may carry the same edge: keep one. */
    if (G->nedges - first_edge > 1) {
        qsort(G->edges + first_edge, (size_t)(G->nedges - first_edge), sizeof *G->edges, cmp_gedge);
        int u = first_edge + 1;
        for (int j = first_edge + 1; j < G->nedges; j++)
            if (cmp_gedge(&G->edges[j], &G->edges[u - 1]))
                G->edges[u++] = G->edges[j];
        G->nedges = u;
    }
    /* Clear marks: re-walk the closure. */
    sp = 0;
    x->stk[sp++] = s0;
    x->inclos[s0] = 0;
    while (sp) {
        int s = x->stk[--sp];
        for (int k = x->eoff[s]; k < x->eoff[s + 1]; k++)
            if (x->t.e[k].kind < 0 && x->inclos[x->t.e[k].to]) {
                x->inclos[x->t.e[k].to] = 0;
                x->stk[sp++] = x->t.e[k].to;
            }
    }
    return rc;
}

/* Rule r's expression through a Thompson NFA into the node table: its kept states (start,
 * and every target of a consuming edge) become nodes, numbered from G->nnodes. */
static int rule_nodes(gr_builder *b, int r, nfa_scratch *x, gtab *G, int32_t *rule_start,
                      md_err *e) {
    int rc = 0;
    x->t.ne = 0;
    x->t.nstates = 2; /* 0 start, 1 accept */
    t_build(&x->t, b->rules[r].expr, 0, 1, 0);
    if (x->t.failed) {
        return e && e->code ? e->code : MD_ENOMEM;
    }
    int S = x->t.nstates;
    if (x->t.ne)
        qsort(x->t.e, (size_t)x->t.ne, sizeof *x->t.e, cmp_tedge_from);
    if (gb_grow((void **)&x->eoff, &x->ceoff, S + 1, sizeof *x->eoff) ||
        gb_grow((void **)&x->map, &x->cmap, S, sizeof *x->map) ||
        gb_grow((void **)&x->inclos, &x->cin, S, 1) ||
        gb_grow((void **)&x->stk, &x->cstk, S, sizeof *x->stk)) {
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    for (int i = 0, k = 0; i <= S; i++) {
        while (k < x->t.ne && x->t.e[k].from < i)
            k++;
        x->eoff[i] = k;
    }
    /* Kept states: start, and every target of a consuming edge. */
    for (int i = 0; i < S; i++)
        x->map[i] = -1;
    int base = G->nnodes, nk = 0;
    x->map[0] = base + nk++;
    for (int k = 0; k < x->t.ne; k++)
        if (x->t.e[k].kind >= 0 && x->map[x->t.e[k].to] < 0)
            x->map[x->t.e[k].to] = base + nk++;
    if (base + nk > GR_MAX_STATES) {
        return md_errf(e, MD_ENOMEM, "grammar too large: more than %d automaton states",
                       GR_MAX_STATES);
    }
    if (gb_grow((void **)&G->off, &G->coff, base + nk + 1, sizeof *G->off) ||
        gb_grow((void **)&G->final, &G->cfinal, base + nk, 1)) {
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    G->nnodes = base + nk;
    rule_start[r] = base;
    /* Emit kept states in the order of their numbers. */
    int32_t *order = malloc(sizeof(int32_t) * (size_t)nk);
    if (!order) {
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    for (int i = 0; i < S; i++)
        if (x->map[i] >= 0)
            order[x->map[i] - base] = i;
    memset(x->inclos, 0, (size_t)(unsigned)S);
    for (int q = 0; q < nk && !rc; q++)
        rc = emit_state(x, G, order[q], base + q, e);
    free(order);
    return rc;
}

/* Live nodes: can reach a final node of their rule through byte edges and calls of
 * productive rules; a rule is productive when its start is live. Fixpoint (backward
 * propagation repeated until nothing changes; each pass is linear). */
static void mark_live(const gtab *G, const int32_t *rule_start, uint8_t *live) {
    for (int n = 0; n < G->nnodes; n++)
        live[n] = G->final[n];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int n = G->nnodes - 1; n >= 0; n--) {
            if (live[n])
                continue;
            for (int k = G->off[n]; k < G->off[n + 1]; k++) {
                gr_edge *ed = &G->edges[k];
                if (live[ed->target] && (ed->kind == GE_BYTES || live[rule_start[ed->label]])) {
                    live[n] = 1;
                    changed = 1;
                    break;
                }
            }
        }
    }
}

/* Drop edges into dead nodes or unproductive rules (compact in place); marks the nodes
 * left with byte edges. */
static void prune_dead(gtab *G, gr_grammar *g, const uint8_t *live, const uint8_t *prod) {
    int w = 0;
    for (int n = 0; n < G->nnodes; n++) {
        int s = G->off[n];
        G->off[n] = w;
        for (int k = s; k < G->off[n + 1]; k++) {
            gr_edge ed = G->edges[k];
            if (!live[n] || !live[ed.target] || (ed.kind == GE_CALL && !prod[ed.label]))
                continue;
            if (ed.kind == GE_BYTES)
                g->has_bytes[n] = 1;
            G->edges[w++] = ed;
        }
    }
    G->off[G->nnodes] = w;
}

/* Nullable rules: the start reaches a final node through calls of nullable rules. */
static void find_nullable(const gtab *G, const int32_t *rule_start, int nr, const uint8_t *prod,
                          uint8_t *nullable) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < nr; r++) {
            if (nullable[r] || !prod[r])
                continue;
            /* DFS from start over calls of nullable rules. */
            int end = r + 1 < nr ? rule_start[r + 1] : G->nnodes;
            int sz = end - rule_start[r];
            int32_t *st = malloc(sizeof(int32_t) * (size_t)sz);
            uint8_t *seen = calloc((size_t)sz, 1);
            if (!st || !seen) {
                free(st);
                free(seen);
                continue;
            }
            int sp = 0;
            st[sp++] = rule_start[r];
            seen[0] = 1;
            while (sp && !nullable[r]) {
                int n = st[--sp];
                if (G->final[n]) {
                    nullable[r] = 1;
                    changed = 1;
                }
                for (int k = G->off[n]; k < G->off[n + 1]; k++)
                    if (G->edges[k].kind == GE_CALL && nullable[G->edges[k].label] &&
                        !seen[G->edges[k].target - rule_start[r]]) {
                        seen[G->edges[k].target - rule_start[r]] = 1;
                        st[sp++] = G->edges[k].target;
                    }
            }
            free(st);
            free(seen);
        }
    }
}

/* Left recursion: rule r calls rule q at a position reachable from r's start through
 * nullable calls only; a cycle in that relation is refused. Iterative DFS, colours.
 * Returns -1 when there is none, -2 when out of memory, else a left-recursive rule. */
static int left_recursion(const gtab *G, const int32_t *rule_start, int nr,
                          const uint8_t *nullable) {
    int lr = -1;
    int32_t *st = malloc(sizeof(int32_t) * ((size_t)G->nnodes + 1));
    uint8_t *seen = calloc((size_t)G->nnodes + 1, 1);
    /* first[r]: list of rules called at nullable-reachable positions. */
    int32_t *foff = calloc((size_t)nr + 1, sizeof(int32_t));
    int32_t *flist = NULL;
    int nf = 0, cf = 0;
    if (!st || !seen || !foff)
        lr = -2;
    for (int r = 0; r < nr && lr == -1; r++) {
        foff[r] = nf;
        int sp = 0;
        st[sp++] = rule_start[r];
        seen[rule_start[r]] = 1;
        int touched_lo = rule_start[r], touched_hi = r + 1 < nr ? rule_start[r + 1] : G->nnodes;
        while (sp) {
            int n = st[--sp];
            for (int k = G->off[n]; k < G->off[n + 1]; k++) {
                gr_edge *ed = &G->edges[k];
                if (ed->kind != GE_CALL)
                    continue;
                if (gb_grow((void **)&flist, &cf, nf + 1, sizeof *flist)) {
                    lr = -2;
                    break;
                }
                flist[nf++] = ed->label;
                if (nullable[ed->label] && !seen[ed->target]) {
                    seen[ed->target] = 1;
                    st[sp++] = ed->target;
                }
            }
        }
        memset(seen + touched_lo, 0, (size_t)(touched_hi - touched_lo));
    }
    if (foff)
        foff[nr] = nf;
    if (lr == -1) {
        /* colour 0 white, 1 grey, 2 black; st holds (rule, next index) pairs. */
        uint8_t *col = calloc((size_t)nr + 1, 1);
        int32_t *it = malloc(sizeof(int32_t) * ((size_t)nr + 1));
        int32_t *rs = malloc(sizeof(int32_t) * ((size_t)nr + 1));
        if (!col || !it || !rs)
            lr = -2;
        for (int r0 = 0; r0 < nr && lr == -1; r0++) {
            if (col[r0])
                continue;
            int sp = 0;
            rs[sp] = r0;
            it[sp++] = foff[r0];
            col[r0] = 1;
            while (sp && lr == -1) {
                int r = rs[sp - 1];
                if (it[sp - 1] >= foff[r + 1]) {
                    col[r] = 2;
                    sp--;
                    continue;
                }
                int q = flist[it[sp - 1]++];
                if (col[q] == 1)
                    lr = q;
                else if (!col[q]) {
                    col[q] = 1;
                    rs[sp] = q;
                    it[sp++] = foff[q];
                }
            }
        }
        free(col);
        free(it);
        free(rs);
    }
    free(st);
    free(seen);
    free(foff);
    free(flist);
    return lr;
}

int gb_finish(gr_builder *b, int root, gr_grammar **out, md_err *e) {
    *out = NULL;
    if (b->failed)
        return e && e->code ? e->code : MD_EINVAL;
    for (int r = 0; r < b->nrules; r++)
        if (b->rules[r].expr < 0)
            return md_errf(e, MD_EINVAL, "rule '%s' is used but never defined", b->rules[r].name);
    int rc = 0;
    int nr = b->nrules;
    gtab G = {0};
    int32_t *rule_start = calloc((size_t)nr + 1, sizeof *rule_start);
    nfa_scratch x = {0};
    x.t.b = b;
    if (!rule_start)
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    for (int r = 0; r < nr && !rc; r++)
        rc = rule_nodes(b, r, &x, &G, rule_start, e);
    free(x.t.e);
    free(x.map);
    free(x.stk);
    free(x.eoff);
    free(x.inclos);
    if (!rc) {
        if (gb_grow((void **)&G.off, &G.coff, G.nnodes + 1, sizeof *G.off))
            rc = md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
        else
            G.off[G.nnodes] = G.nedges;
    }
    gr_grammar *g = NULL;
    if (!rc) {
        g = calloc(1, sizeof *g);
        if (!g)
            rc = md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    if (rc) {
        free(G.edges);
        free(G.off);
        free(G.final);
        free(rule_start);
        return rc;
    }
    g->n_nodes = G.nnodes;
    g->n_rules = nr;
    g->root = root;
    g->rule_start = rule_start;
    g->edge_off = G.off;
    g->edges = G.edges;
    g->final = G.final;
    pthread_mutex_init(&g->lock, NULL);
    g->n_cls = b->ncls;
    g->cls = malloc(sizeof(gr_cls) * (size_t)(b->ncls ? b->ncls : 1));
    g->has_bytes = calloc((size_t)G.nnodes + 1, 1);
    uint8_t *prod = calloc((size_t)nr + 1, 1), *nullable = calloc((size_t)nr + 1, 1);
    uint8_t *live = calloc((size_t)G.nnodes + 1, 1);
    if (!g->cls || !g->has_bytes || !prod || !nullable || !live) {
        free(prod);
        free(nullable);
        free(live);
        gr_free(g);
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    if (b->ncls)
        memcpy(g->cls, b->cls, sizeof(gr_cls) * (size_t)b->ncls);
    int32_t *rule_of = malloc(sizeof(int32_t) * ((size_t)G.nnodes + 1));
    if (!rule_of) {
        free(prod);
        free(nullable);
        free(live);
        gr_free(g);
        return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
    }
    for (int r = 0; r < nr; r++) {
        int end = r + 1 < nr ? rule_start[r + 1] : G.nnodes;
        for (int n = rule_start[r]; n < end; n++)
            rule_of[n] = r;
    }
    mark_live(&G, rule_start, live);
    for (int r = 0; r < nr; r++)
        prod[r] = live[rule_start[r]];
    if (!prod[root]) {
        free(prod);
        free(nullable);
        free(live);
        free(rule_of);
        gr_free(g);
        return md_errf(e, MD_EINVAL,
                       "the grammar generates no string at all (a recursion without a base "
                       "case, or contradictory constraints)");
    }
    prune_dead(&G, g, live, prod);
    g->edges = G.edges;
    find_nullable(&G, rule_start, nr, prod, nullable);
    int lr = left_recursion(&G, rule_start, nr, nullable);
    if (lr == -1 && follow_sets(g, nullable, rule_of))
        lr = -2;
    free(prod);
    free(nullable);
    free(live);
    g->rule_of = rule_of;
    if (lr != -1) {
        if (lr == -2) {
            gr_free(g);
            return md_errf(e, MD_ENOMEM, "out of memory compiling a grammar");
        }
        rc = md_errf(e, MD_EUNSUPP,
                     "rule '%s' is left-recursive (it can reach itself without consuming a "
                     "byte); rewrite it with repetition",
                     b->rules[lr].name);
        gr_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void gr_free(gr_grammar *g) {
    if (!g)
        return;
    gr_cache_free_all(g);
    pthread_mutex_destroy(&g->lock);
    free(g->rule_start);
    free(g->edge_off);
    free(g->edges);
    free(g->final);
    free(g->has_bytes);
    free(g->cls);
    free(g->first);
    free(g->follow);
    free(g->rule_of);
    free(g);
}
