/* model_unpack.c — see model_unpack.h. The checks run over the whole archive before the
 * first byte is written, so a hostile archive leaves nothing behind; files are created
 * with O_EXCL | O_NOFOLLOW inside a directory this code made, so no entry can write
 * through a link or over another. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "cli/model_unpack.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/child.h"

/* argv[1]: the zip, argv[2]: the directory to make. Exit status 1 with one line on stderr. */
static const char k_unzip_py[] =
    "import os, stat, sys, zipfile\n"
    "src, dst = sys.argv[1], sys.argv[2]\n"
    "MAX_ENTRIES, MAX_BYTES = 10000, 16 << 30\n"
    "def refuse(why):\n"
    "    sys.exit('model archive %s: %s' % (src, why))\n"
    "def check(infos):\n"
    "    if len(infos) > MAX_ENTRIES:\n"
    "        refuse('%d entries, more than %d' % (len(infos), MAX_ENTRIES))\n"
    "    seen, total = set(), 0\n"
    "    for i in infos:\n"
    "        n = i.filename\n"
    "        parts = n[:-1].split('/') if n.endswith('/') else n.split('/')\n"
    "        if (not n or n.startswith('/') or '\\\\' in n or '\\0' in n\n"
    "                or any(p in ('', '.', '..') for p in parts)):\n"
    "            refuse('entry %r is not a plain relative path' % n)\n"
    "        kind = stat.S_IFMT(i.external_attr >> 16)\n"
    "        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):\n"
    "            refuse('entry %r is not a file or directory (mode %o)' % (n, kind))\n"
    "        key = '/'.join(parts)\n"
    "        if key in seen:\n"
    "            refuse('entry %r is given twice' % n)\n"
    "        seen.add(key)\n"
    "        total += i.file_size\n"
    "        if total > MAX_BYTES:\n"
    "            refuse('more than %d bytes unpacked' % MAX_BYTES)\n"
    "def write(z, i):\n"
    "    path = os.path.join(dst, *[p for p in i.filename.split('/') if p])\n"
    "    if i.is_dir():\n"
    "        os.makedirs(path, 0o755, exist_ok=True)\n"
    "        return\n"
    "    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)\n"
    "    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)\n"
    "    with os.fdopen(fd, 'wb') as out, z.open(i) as inp:\n"
    "        left = i.file_size\n"
    "        while True:\n"
    "            b = inp.read(1 << 20)\n"
    "            if not b:\n"
    "                break\n"
    "            left -= len(b)\n"
    "            if left < 0:\n"
    "                refuse('entry %r unpacks past its size' % i.filename)\n"
    "            out.write(b)\n"
    "try:\n"
    "    with zipfile.ZipFile(src) as z:\n"
    "        check(z.infolist())\n"
    "        os.mkdir(dst, 0o755)\n"
    "        for i in z.infolist():\n"
    "            write(z, i)\n"
    "except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:\n"
    "    refuse(str(e))\n";

int model_unpack_zip(const char *python, const char *zip, const char *dest, md_err *e) {
    if (access(dest, F_OK) == 0)
        return md_errf(e, MD_EIO, "%s exists already; not unpacking over it", dest);
    char *argv[] = {(char *)python, "-c", (char *)k_unzip_py, (char *)zip, (char *)dest, NULL};
    int rc = cli_run_child(argv, NULL, 0, e);
    if (!rc)
        return 0;
    md_err tmp = {0};
    model_remove_tree(dest, &tmp);
    return md_errf(e, MD_EFORMAT, "unpacking %s failed (the reason is printed above)", zip);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int model_remove_tree(const char *dir, md_err *e) {
    if (access(dir, F_OK) != 0)
        return 0;
    if (nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return md_errf(e, MD_EIO, "removing %s: %s", dir, strerror(errno));
    return 0;
}
