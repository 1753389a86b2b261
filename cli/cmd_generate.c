/* cmd_generate.c — `medley generate`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_generate(int argc, char **argv) {
    fprintf(stderr, "medley generate: not built yet\n");
    return 1;
}
