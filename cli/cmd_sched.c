/* cmd_client.c — placeholder until the queue issue lands. */
#include <stdio.h>

#include "cli/commands.h"

static int nb(const char *n) {
    fprintf(stderr, "medley %s: not built yet\n", n);
    return 1;
}
int cmd_scheduler(int argc, char **argv) { return nb(argv[0]); }
int cmd_plan(int argc, char **argv) { return nb(argv[0]); }
int cmd_simulate(int argc, char **argv) { return nb(argv[0]); }
