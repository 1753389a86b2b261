/* cmd_run.c — `medley run`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_run(int argc, char **argv) {
    fprintf(stderr, "medley run: not built yet\n");
    return 1;
}
