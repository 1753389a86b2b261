/* daemon_metrics.h — the scheduler daemon's Prometheus metrics (`medley scheduler --metrics`;
 * names and meanings in docs/operations.md, "Metrics"): leadership, rounds, the fleet and
 * backlogs it read, solve time, and the plans it published. daemon.c calls these hooks; each
 * takes NULL (no --metrics) and then does nothing. Private to scheduler/. */
#ifndef MEDLEY_SCHEDULER_DAEMON_METRICS_H
#define MEDLEY_SCHEDULER_DAEMON_METRICS_H

#include <jansson.h>

#include "common/metrics.h"

typedef struct sched_dm sched_dm;

/* The families in reg (NULL: none, returns NULL). NULL too when they cannot be made (said
 * in the log): the daemon then runs without metrics. Free with sched_dm_free. */
sched_dm *sched_dm_new(md_metrics *reg);
void sched_dm_free(sched_dm *dm);
/* Each round: whether this scheduler holds the lease. */
void sched_dm_leader(sched_dm *dm, int leader);
/* A round as the leader: the fleet's pools (fleet.schema.json pools: type, count), the
 * workers they came from, and the backlog per model (an object model -> requests). */
void sched_dm_round(sched_dm *dm, const json_t *pools, const json_t *workers,
                    const json_t *backlog);
/* Building the candidates and solving took solve_s seconds. */
void sched_dm_solved(sched_dm *dm, double solve_s);
/* A plan was published (doc: plan.schema.json), for reason. */
void sched_dm_published(sched_dm *dm, const json_t *doc, const char *reason);

#endif
