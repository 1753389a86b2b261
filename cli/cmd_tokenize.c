/* cmd_tokenize.c — `medley tokenize`: not built yet (placeholder until its issue lands). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_tokenize(int argc, char **argv) {
    fprintf(stderr, "medley tokenize: not built yet\n");
    return 1;
}
