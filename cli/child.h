/* child.h — running a helper program from the CLI (child.c): fork/exec, never a shell, and
 * the Python interpreter `medley models fetch` uses for pip and zip files. */
#ifndef MEDLEY_CLI_CHILD_H
#define MEDLEY_CLI_CHILD_H

#include <stddef.h>

#include "common/err.h"

/* $MEDLEY_PYTHON, else "python3". */
const char *cli_python(void);
/* Run argv (no shell); with out != NULL, capture up to outsz-1 bytes of its stdout
 * (NUL-terminated). 0 when it exited with status 0; MD_EIO naming the status or signal. */
int cli_run_child(char *const argv[], char *out, size_t outsz, md_err *e);

#endif
