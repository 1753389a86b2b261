/* pack.h — private to scheduler/: a plan's replica counts made into replicas on GPUs
 * (pack.c), shared by the MILP (milp.c) and the proportional baseline. */
#ifndef MEDLEY_SCHEDULER_PACK_H
#define MEDLEY_SCHEDULER_PACK_H

#include "scheduler/sched.h"

/* Instantiate llround(counts[c]) replicas of each candidate c with shares y[c][k] (replica-
 * equivalents) into p->r, their GPU ids taken first fit over the pools' hosts (the same on
 * every run); GPUs not taken become p->idle. A replica that cannot be packed is dropped
 * with a note. MD_ENOMEM on allocation failure. */
int sched_materialise(sched_plan *p, const sched_fleet *f, const sched_workload *w,
                      const sched_cands *cs, const double *counts, double (*y)[SCHED_MAX_CLASSES],
                      md_err *e);

#endif
