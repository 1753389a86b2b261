/* sim.c — discrete-event fleet simulator. Requests (a backlog at t=0 and/or Poisson arrivals)
 * wait in one queue per (model, size class), as the Redis streams do; each replica of the plan
 * pulls from the classes the plan routes to it (the one furthest below its routing share first,
 * skipping one whose next request does not fit its free KV), as a worker reads its replica's
 * class streams, and from the others it holds when those have nothing waiting. A replica runs
 * continuous batching: each iteration admits what fits its KV (a request reserves prompt +
 * output), prefills the newcomers and advances every running sequence by one token, taking the
 * time the performance model gives for that batch and context. A failed GPU kills its replica;
 * its running requests go back to the front of their queues. A plan with route_even is a load
 * balancer instead: each model's requests are dealt to the replicas that serve their class in
 * turn, one queue per replica, whatever its speed. A replica is billed from 0 until it has no
 * work left and none can arrive, or until it fails. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/sched.h"

typedef struct req {
    double arrive;
    float in, out;
    short model, cls;
} req;

typedef struct queue {
    int *ids, n, head;  /* arrival order */
    int *retry, nretry; /* handed back by failed replicas, served first */
} queue;

typedef struct run {
    int id;
    float left; /* output tokens still to generate */
} run;

typedef struct rep {
    queue *q; /* its class queues: the model's shared ones, or its own (route_even) */
    const sched_cand *c;
    const sched_replica *r;
    const sched_demand *d;
    run *running;
    int nrun, cap_batch;
    double kv_cap, kv_used, ctx_sum;
    double served[SCHED_MAX_CLASSES];
    double end;
    int dead, done;
} rep;

static unsigned long long rng_next(unsigned long long *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double rng_unit(unsigned long long *s) {
    return (rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Heap of (time, replica) for the next iteration of each live replica. */
typedef struct ev {
    double t;
    int r;
} ev;

static void heap_push(ev *h, int *n, ev x) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p].t <= x.t)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static ev heap_pop(ev *h, int *n) {
    ev top = h[0], x = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        double mt = x.t;
        if (l < *n && h[l].t < mt)
            m = l, mt = h[l].t;
        if (r < *n && h[r].t < mt)
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = x;
    return top;
}

/* Time of one decode iteration of b sequences at mean context ctx on candidate c. */
static double step_time(const sched_cand *c, const sched_model *m, const sched_catalog *cat,
                        double inter_gbps, int b, double ctx, int cls,
                        const sched_perf_params *pp) {
    /* a profile's step; an embedding model's: a batch embedded (its requests' one "token") */
    if (!strcmp(c->perf[cls].bound, "profile") || m->embedding)
        return c->perf[cls].decode_step_s * fmax(1.0, (double)b / c->perf[cls].batch) /
               (m->embedding && c->perf[cls].scale > 0 ? c->perf[cls].scale : 1);
    int S = c->nstages;
    int mb = (b + S - 1) / S;
    double tick = 0;
    for (int s = 0; s < S; s++) {
        const sched_stage *st = &c->stages[s];
        double t =
            sched_perf_decode_step(m, &cat->gpus[st->type], st->tp, st->layer_hi - st->layer_lo,
                                   st->layer_lo == 0, st->layer_hi == m->layers, mb, ctx, pp);
        if (S > 1)
            t += sched_perf_pp_hop(s + 1 < S ? mb * m->hidden * 2.0 : mb * 4.0, inter_gbps, pp);
        tick = fmax(tick, t);
    }
    return S * tick / (c->perf[cls].scale > 0 ? c->perf[cls].scale : 1);
}

/* The replica time one prompt's prefill takes: in a pipeline each stage is busy with its
 * own layers and its hop while the others work on other micro-batches, so the slowest stage
 * sets it (as in sched_perf_replica; the pipeline's fill is not counted). */
static double prefill_time(const sched_cand *c, const sched_model *m, const sched_catalog *cat,
                           double inter_gbps, double in, int cls, const sched_perf_params *pp) {
    if (!strcmp(c->perf[cls].bound, "profile") || m->embedding)
        return 0; /* in the step (step_time) */
    double t = 0;
    for (int s = 0; s < c->nstages; s++) {
        const sched_stage *st = &c->stages[s];
        double ts = sched_perf_prefill(m, &cat->gpus[st->type], st->tp, st->layer_hi - st->layer_lo,
                                       st->layer_lo == 0, st->layer_hi == m->layers, in, pp);
        if (s + 1 < c->nstages)
            ts += sched_perf_pp_hop(in * m->hidden * 2.0, inter_gbps, pp);
        t = fmax(t, ts);
    }
    return t / (c->perf[cls].scale > 0 ? c->perf[cls].scale : 1);
}

/* Queue of (model m, class k) has a request that arrived by `now`: its id, else -1. */
static int q_peek(queue *q, const req *R, double now) {
    if (q->nretry)
        return q->retry[q->nretry - 1];
    if (q->head < q->n && R[q->ids[q->head]].arrive <= now)
        return q->ids[q->head];
    return -1;
}

static void q_pop(queue *q) {
    if (q->nretry)
        q->nretry--;
    else
        q->head++;
}

/* Append request id to q in arrival order. Returns 0, or -1 when out of memory. */
static int q_push(queue *q, int id) {
    if (q->n % 1024 == 0) {
        int *n = realloc(q->ids, (size_t)(q->n + 1024) * sizeof *n);
        if (!n)
            return -1;
        q->ids = n;
    }
    q->ids[q->n++] = id;
    return 0;
}

static int q_retry(queue *q, int id) {
    int *n = realloc(q->retry, (size_t)(q->nretry + 1) * sizeof *n);
    if (!n)
        return -1;
    q->retry = n;
    q->retry[q->nretry++] = id;
    return 0;
}

/* The next live replica after *turn (in turn) of model m that serves class k, or -1. */
static int next_taker(const rep *P, int np, int m, int k, int *turn) {
    for (int i = 0; i < np; i++) {
        int r = (*turn + 1 + i) % np;
        const rep *y = &P[r];
        if (!y->dead && y->c->model == m && y->c->serves[k] && y->r->share[k] > 0) {
            *turn = r;
            return r;
        }
    }
    return -1;
}

/* route_even: deal each shared (model, class) queue to the replicas that serve the class, in
 * turn; what no replica serves stays in the shared queue, unserved. Returns 0 or -1 (memory). */
static int deal_even(const sched_workload *w, queue *Q, rep *P, int np) {
    for (int m = 0; m < w->n; m++)
        for (int k = 0; k < w->models[m].nclasses; k++) {
            queue *src = &Q[m * SCHED_MAX_CLASSES + k];
            int turn = -1, kept = 0;
            for (int i = 0; i < src->n; i++) {
                int r = next_taker(P, np, m, k, &turn);
                if (r < 0)
                    src->ids[kept++] = src->ids[i];
                else if (q_push(&P[r].q[k], src->ids[i]))
                    return -1;
            }
            src->n = kept;
        }
    return 0;
}

/* The requests of w into R (at most total) and their (model, class) queues Q: each model's
 * backlog at t=0, then its Poisson arrivals until the horizon, each of a class drawn by share.
 * Returns how many, or -1 when out of memory. */
static int make_requests(const sched_workload *w, long long total, unsigned long long *seed, req *R,
                         queue *Q) {
    int nr = 0;
    for (int m = 0; m < w->n; m++) {
        const sched_demand *d = &w->models[m];
        double t = 0;
        long long backlog = (long long)d->requests;
        for (long long i = 0;; i++) {
            double at = 0;
            if (i >= backlog) {
                if (d->rate_rps <= 0)
                    break;
                t += -log(1 - rng_unit(seed)) / d->rate_rps;
                if (t > w->horizon_s)
                    break;
                at = t;
            }
            double u = rng_unit(seed), acc = 0;
            int k = 0;
            for (k = 0; k < d->nclasses - 1; k++) {
                acc += d->classes[k].share;
                if (u < acc)
                    break;
            }
            const sched_class *cl = &d->classes[k];
            /* Lengths uniform in [0.5, 1.5] x the class mean, within the class bound. */
            double in = fmax(1, round(cl->input_mean * (0.5 + rng_unit(seed))));
            double out = fmax(1, round(cl->output_mean * (0.5 + rng_unit(seed))));
            if (in + out > cl->max_tokens)
                in = fmax(1, cl->max_tokens - out);
            if (nr >= total)
                break;
            R[nr] = (req){at, (float)in, (float)out, (short)m, (short)k};
            if (q_push(&Q[m * SCHED_MAX_CLASSES + k], nr++))
                return -1;
        }
    }
    return nr;
}

/* The plan's replicas into P, each with its first iteration at t=0 in H; replica i's own
 * queues (route_even) are Q[(w->n + i) * SCHED_MAX_CLASSES ...]. Returns 0, or -1 when out of
 * memory. */
static int make_replicas(const sched_plan *p, const sched_workload *w, const sched_cands *cs,
                         const sched_perf_params *pp, queue *Q, rep *P, ev *H) {
    for (int i = 0; i < p->n; i++) {
        rep *x = &P[i];
        x->r = &p->r[i];
        x->c = &cs->c[x->r->cand];
        x->d = &w->models[x->c->model];
        x->q = &Q[(p->route_even ? w->n + i : x->c->model) * SCHED_MAX_CLASSES];
        x->kv_cap = 0;
        for (int k = 0; k < x->d->nclasses; k++)
            if (x->c->serves[k])
                x->kv_cap = x->c->perf[k].kv_tokens;
        x->cap_batch = pp->max_batch;
        /* a class with a TPOT SLO bounds the batch at what the performance model allows */
        for (int k = 0; k < x->d->nclasses; k++)
            if (x->c->serves[k] && x->d->classes[k].tpot_ms > 0 && x->c->perf[k].batch >= 1 &&
                x->c->perf[k].batch < x->cap_batch)
                x->cap_batch = x->c->perf[k].batch;
        x->running = malloc((size_t)x->cap_batch * sizeof *x->running);
        if (!x->running)
            return -1;
        H[i] = (ev){0, i};
    }
    return 0;
}

/* The failures due by now, from *next on: each kills its replica, whose running requests go
 * back to the front of their queues (route_even: to the other replicas of the class, in turn,
 * with what was still queued for it). Returns 0, or -1 when out of memory. */
static int apply_failures(const sched_sim_failure *fails, int nfails, const int *fail_rep,
                          int *next, double now, rep *P, int np, int even, const req *R,
                          sched_sim_result *res) {
    for (; *next < nfails && fails[*next].at_s <= now; (*next)++) {
        int r = fail_rep[*next];
        if (r < 0 || P[r].dead)
            continue;
        rep *y = &P[r];
        y->dead = 1;
        y->end = fails[*next].at_s;
        int turn = r;
        for (int j = 0; j < y->nrun; j++) {
            const req *q0 = &R[y->running[j].id];
            int to = even ? next_taker(P, np, q0->model, q0->cls, &turn) : r;
            if (to >= 0 && q_retry(&P[to].q[q0->cls], y->running[j].id))
                return -1;
            res->retried++;
        }
        y->nrun = 0;
        for (int k = 0; even && k < y->d->nclasses; k++) {
            queue *q = &y->q[k];
            for (; q->nretry || q->head < q->n; q_pop(q)) {
                int id = q->nretry ? q->retry[q->nretry - 1] : q->ids[q->head];
                int to = next_taker(P, np, y->c->model, k, &turn);
                if (to < 0)
                    break;
                if (q_push(&P[to].q[k], id))
                    return -1;
            }
        }
    }
    return 0;
}

/* Routing is a preference (issue 39 item 11): a replica whose routed classes have nothing
 * waiting takes from another class of its model that it can hold (its KV fits the class),
 * the longest queue first, as the worker reads the plan's `steal` classes when its own
 * streams are empty. any: every class it holds is fair game (route_pull: plain work
 * stealing, the routing ignored). Only a queue whose next request needs at most room tokens
 * of KV. The class, with its first request in *id, or -1. */
static int steal(const rep *y, const req *R, double now, int any, double room, int *id) {
    int best = -1, most = 0;
    for (int k = 0; k < y->d->nclasses; k++) {
        if (!y->c->serves[k] || (y->r->share[k] > 0 && !any))
            continue;
        const queue *q = &y->q[k];
        int cand = q_peek((queue *)q, R, now), waiting = q->nretry + q->n - q->head;
        if (cand >= 0 && waiting > most && R[cand].in + R[cand].out <= room) {
            most = waiting, best = k, *id = cand;
        }
    }
    return best;
}

/* Admit into replica y what has arrived by now and fits its batch and KV, the class furthest
 * below its routing share first. fill (medley's routing, not the bench's baselines): among
 * its routed classes, those whose next request fits the free KV, rather than stopping at one
 * whose next request does not while a smaller routed one waits (issue 39 item 11: bench
 * (a)'s two A100s routed 99% 3,000-token prompts ran batches of 132 at 99% KV while the
 * 200-token prompts also routed to them waited for their 1% share). Returns the prefill time
 * of the newcomers (s); *cls_any is the last class admitted. */
static double admit(rep *y, const req *R, double now, const sched_catalog *cat, double link_gbps,
                    const sched_perf_params *pp, int pull, int fill, int *cls_any) {
    const sched_model *m = &y->d->model;
    double pre = 0;
    for (;;) {
        if (y->nrun >= y->cap_batch)
            break;
        int best = -1, id = -1, waiting = 0;
        double bestv = INFINITY, room = fill ? y->kv_cap - y->kv_used : INFINITY;
        for (int k = 0; k < y->d->nclasses; k++) {
            if (pull || !y->c->serves[k] || y->r->share[k] <= 0)
                continue;
            int cand = q_peek(&y->q[k], R, now);
            if (cand < 0)
                continue;
            waiting = 1;
            double v = y->served[k] / y->r->share[k];
            if (v < bestv && R[cand].in + R[cand].out <= room) {
                bestv = v, best = k, id = cand;
            }
        }
        if (best < 0 && !waiting)
            best = steal(y, R, now, pull, room, &id);
        if (best < 0)
            break;
        double need = R[id].in + R[id].out;
        if (y->kv_used + need > y->kv_cap)
            break;
        q_pop(&y->q[best]);
        y->served[best] += 1;
        y->kv_used += need;
        y->ctx_sum += R[id].in;
        y->running[y->nrun++] = (run){id, R[id].out};
        pre += prefill_time(y->c, m, cat, link_gbps, R[id].in, best, pp);
        *cls_any = best;
    }
    return pre;
}

/* Replica r (y) has nothing to run now: sleep until the next arrival it may take, or finish. */
static void idle_or_finish(rep *y, int r, const req *R, double now, ev *H, int *nh) {
    double next = INFINITY;
    for (int k = 0; k < y->d->nclasses; k++) {
        const queue *q = &y->q[k];
        if (y->c->serves[k] && q->head < q->n)
            next = fmin(next, R[q->ids[q->head]].arrive);
    }
    if (isfinite(next) && next > now) {
        heap_push(H, nh, (ev){next, r});
    } else if (!isfinite(next)) {
        y->done = 1;
        y->end = now;
    } else {
        /* A request is waiting but does not fit an empty replica: unservable here. */
        y->done = 1;
        y->end = now;
    }
}

/* Advance every running sequence of y by one token; those that end count in res at now. */
static void advance(rep *y, const req *R, double now, sched_sim_result *res) {
    for (int j = 0; j < y->nrun;) {
        run *u = &y->running[j];
        u->left -= 1;
        y->ctx_sum += 1;
        if (u->left <= 0) {
            const req *q0 = &R[u->id];
            res->tokens += q0->in + q0->out;
            res->requests_done++;
            y->kv_used -= q0->in + q0->out;
            y->ctx_sum -= q0->in + q0->out;
            if (now > res->makespan_s)
                res->makespan_s = now;
            y->running[j] = y->running[--y->nrun];
        } else {
            j++;
        }
    }
}

int sched_simulate(const sched_plan *p, const sched_workload *w, const sched_fleet *f,
                   const sched_catalog *cat, const sched_cands *cs, const sched_perf_params *pp_in,
                   const sched_sim_failure *fails, int nfails, sched_sim_result *res, md_err *e) {
    memset(res, 0, sizeof *res);
    /* Pipeline hops cost the fleet's inter-host latency, as in the candidates (cand.c). */
    sched_perf_params pq = *pp_in;
    pq.inter_host_latency_s = f->link_latency_s;
    const sched_perf_params *pp = &pq;
    /* Requests. */
    unsigned long long seed = 0x9E3779B97F4A7C15ull ^ (w->seed * 0x2545F4914F6CDD1Dull);
    long long total = 0;
    for (int m = 0; m < w->n; m++)
        total += (long long)w->models[m].requests +
                 (long long)ceil(w->models[m].rate_rps * w->horizon_s * 1.2 + 16);
    if (total > 50000000)
        return md_errf(e, MD_ERANGE, "simulation of %lld requests is over the 5e7 limit", total);
    req *R = malloc((size_t)(total + 1) * sizeof *R);
    /* Shared (model, class) queues, then one set per replica when dealt evenly. */
    int nq = (w->n + (p->route_even ? p->n : 0)) * SCHED_MAX_CLASSES;
    queue *Q = calloc((size_t)nq, sizeof *Q);
    rep *P = calloc((size_t)p->n + 1, sizeof *P);
    ev *H = malloc(((size_t)p->n + 1) * sizeof *H);
    if (!R || !Q || !P || !H) {
        free(R), free(Q), free(P), free(H);
        return md_errf(e, MD_ENOMEM, "out of memory for %lld simulated requests", total);
    }
    int nr = make_requests(w, total, &seed, R, Q);
    if (nr < 0)
        goto oom;
    res->requests_total = nr;
    /* Replicas. */
    if (make_replicas(p, w, cs, pp, Q, P, H) || (p->route_even && deal_even(w, Q, P, p->n)))
        goto oom;
    int nh = p->n; /* every replica starts at t=0: already a heap */
    /* Failures, in time order, mapped to replicas. */
    int *fail_rep = malloc(((size_t)nfails + 1) * sizeof *fail_rep);
    if (!fail_rep)
        goto oom;
    for (int i = 1; i < nfails; i++)
        if (fails[i].at_s < fails[i - 1].at_s) {
            free(fail_rep);
            for (int r = 0; r < p->n; r++)
                free(P[r].running);
            for (int k = 0; k < nq; k++)
                free(Q[k].ids);
            free(R), free(Q), free(P), free(H);
            return md_errf(e, MD_EINVAL, "failures must be given in time order");
        }
    for (int i = 0; i < nfails; i++) {
        fail_rep[i] = -1;
        for (int r = 0; r < p->n && fail_rep[i] < 0; r++)
            for (int g = 0; g < P[r].c->gpus; g++)
                if (!strcmp(p->r[r].gpu_ids[g], fails[i].gpu))
                    fail_rep[i] = r;
    }
    int nextfail = 0;
    double now = 0;
    while (nh > 0) {
        ev x = heap_pop(H, &nh);
        now = x.t;
        if (apply_failures(fails, nfails, fail_rep, &nextfail, now, P, p->n, p->route_even, R, res))
            goto oom;
        rep *y = &P[x.r];
        if (y->dead)
            continue;
        const sched_model *m = &y->d->model;
        /* Admit. */
        int cls_any = 0;
        double pre = admit(y, R, now, cat, f->link_gbps, pp, p->route_pull,
                           !p->route_pull && !p->route_even, &cls_any);
        if (y->nrun == 0) {
            idle_or_finish(y, x.r, R, now, H, &nh);
            continue;
        }
        double ctx = y->ctx_sum / y->nrun;
        double dt = pre + step_time(y->c, m, cat, f->link_gbps, y->nrun, ctx, cls_any, pp);
        now += dt;
        advance(y, R, now, res);
        heap_push(H, &nh, (ev){now, x.r});
    }
    for (int i = 0; i < p->n; i++) {
        double paid = P[i].end;
        if (w->bill_to_finish && !P[i].dead)
            paid = fmax(paid, P[i].d->finish_s); /* a rental kept until the deadline */
        res->usd += P[i].c->usd_per_hour * paid / 3600;
        free(P[i].running);
    }
    res->requests_unserved = res->requests_total - res->requests_done;
    res->tokens_per_s = res->makespan_s > 0 ? res->tokens / res->makespan_s : 0;
    res->usd_per_mtok = res->tokens > 0 ? res->usd / res->tokens * 1e6 : 0;
    res->tokens_per_usd = res->usd > 0 ? res->tokens / res->usd : 0;
    for (int i = 0; i < nq; i++) {
        free(Q[i].ids);
        free(Q[i].retry);
    }
    free(fail_rep);
    free(R), free(Q), free(P), free(H);
    return 0;
oom:
    for (int i = 0; i < p->n; i++)
        free(P[i].running);
    for (int i = 0; i < nq; i++) {
        free(Q[i].ids);
        free(Q[i].retry);
    }
    free(R), free(Q), free(P), free(H);
    return md_errf(e, MD_ENOMEM, "out of memory in the simulator");
}
