/* cmd_worker.c — `medley worker`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_worker(int argc, char **argv) {
    fprintf(stderr, "medley worker: not built yet\n");
    return 1;
}
