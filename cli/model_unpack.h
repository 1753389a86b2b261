/* model_unpack.h — a registry model that comes as a zip of its directory (model_unpack.c):
 * unpacked safely with Python's zipfile (no path leaves the directory, no links, no special
 * files, bounded size), and a model directory removed without following links. */
#ifndef MEDLEY_CLI_MODEL_UNPACK_H
#define MEDLEY_CLI_MODEL_UNPACK_H

#include "common/err.h"

/* Unpack zip into dest, which must not exist yet (it is created). Refused (MD_EFORMAT,
 * naming the entry) before anything is written: an absolute name, a '..' or empty
 * component, a backslash, a name given twice, a symbolic link or other non-regular entry,
 * more than 10,000 entries or more than 16 GiB unpacked. A refused or failed unpack
 * removes what it made of dest. python: the interpreter (cli_python()). */
int model_unpack_zip(const char *python, const char *zip, const char *dest, md_err *e);
/* Remove dir and everything under it; links are removed, never followed. 0, or MD_EIO. */
int model_remove_tree(const char *dir, md_err *e);

#endif
