/* cmd_models.c — `medley models`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_models(int argc, char **argv) {
    fprintf(stderr, "medley models: not built yet\n");
    return 1;
}
