/* cmd_profile.c — `medley profile`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_profile(int argc, char **argv) {
    fprintf(stderr, "medley profile: not built yet\n");
    return 1;
}
