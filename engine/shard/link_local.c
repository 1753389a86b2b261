/* link_local.c — a pipeline stage in the head's own process (link.h): the hidden states are
 * host memory the stage uploads onto its backend and downloads from it (backend.h's
 * host-staged copy; a peer copy between GPUs of one process would skip the host). */
#include <stdio.h>
#include <stdlib.h>

#include "engine/shard/link.h"

typedef struct {
    md_link base;
    md_stage *st;
    char desc[448];
} local_link;

static int local_run(md_link *l, const md_batch *b, const float *in, float *out, md_err *e) {
    return md_stage_run(((local_link *)l)->st, b, in, out, e);
}

static const char *local_describe(md_link *l) {
    return ((local_link *)l)->desc;
}

static void local_free(md_link *l) {
    local_link *k = (local_link *)l;
    md_stage_close(k->st);
    free(k);
}

static const md_link_ops local_ops = {
    .kind = "local", .run = local_run, .describe = local_describe, .free = local_free};

int md_link_local_open(const md_stage_config *c, md_link **out, md_err *e) {
    *out = NULL;
    local_link *k = calloc(1, sizeof *k);
    if (!k)
        return md_errf(e, MD_ENOMEM, "out of memory");
    k->base.ops = &local_ops;
    int rc = md_stage_open(c, &k->st, e);
    if (rc) {
        free(k);
        return rc;
    }
    snprintf(k->desc, sizeof k->desc, "local %s", md_stage_describe(k->st));
    *out = &k->base;
    return 0;
}

void md_link_free(md_link *l) {
    if (l)
        l->ops->free(l);
}
