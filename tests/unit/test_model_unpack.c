/* test_model_unpack.c — unpacking a registry model's zip (cli/model_unpack.c, what `medley
 * models fetch all-minilm-l6-v2` does after the sha256 check): a good archive gives its
 * directory; hostile ones (path traversal with '..', an absolute name, a backslash name, a
 * symbolic link, a name given twice, a file where a directory must go) are refused, write
 * nothing outside the destination and leave no destination behind. The zips are written by
 * Python's zipfile, the same module the unpacker runs. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/child.h"
#include "cli/model_unpack.h"

static char tmp[64];

static int setup(void **st) {
    (void)st;
    strcpy(tmp, "/tmp/medley-unpack-XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    md_err e = {0};
    return model_remove_tree(tmp, &e);
}

/* Write tmp/NAME.zip for each (NAME, SPEC) pair of args, in one Python run. SPEC: entries
 * separated by '|', "name=content" for a file, "name->target" for a symbolic link. */
static void make_zips(const char *const *args, int n) {
    char *argv[32] = {(char *)cli_python(), "-c",
                      "import sys, warnings, zipfile\n"
                      "warnings.simplefilter('ignore')\n"
                      "for name, spec in zip(sys.argv[2::2], sys.argv[3::2]):\n"
                      "    with zipfile.ZipFile(sys.argv[1] + '/' + name + '.zip', 'w') as z:\n"
                      "        for ent in spec.split('|'):\n"
                      "            if '->' in ent:\n"
                      "                n, target = ent.split('->')\n"
                      "                i = zipfile.ZipInfo(n)\n"
                      "                i.external_attr = 0o120777 << 16\n"
                      "                z.writestr(i, target)\n"
                      "            else:\n"
                      "                n, data = ent.split('=')\n"
                      "                z.writestr(zipfile.ZipInfo(n), data)\n",
                      tmp};
    int k = 4;
    for (int i = 0; i < n && k < 31; i++)
        argv[k++] = (char *)args[i];
    argv[k] = NULL;
    md_err e = {0};
    if (cli_run_child(argv, NULL, 0, &e))
        fail_msg("making the zips: %s", e.msg);
}

static int exists(const char *rel) {
    char p[256];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", tmp, rel);
    return lstat(p, &st) == 0;
}

static int unpack(const char *name, const char *dest, md_err *e) {
    char zip[128], dst[128];
    snprintf(zip, sizeof zip, "%s/%s.zip", tmp, name);
    snprintf(dst, sizeof dst, "%s/%s", tmp, dest);
    return model_unpack_zip(cli_python(), zip, dst, e);
}

static void a_good_archive_gives_its_directory(void **st) {
    (void)st;
    const char *good[] = {"good",
                          "config.json={}|1_Pooling/config.json={\"a\": 1}|tokenizer.json=t"};
    make_zips(good, 2);
    md_err e = {0};
    assert_int_not_equal(unpack("good", "out/model", &e), 0); /* its parent is missing */
    assert_int_equal(unpack("good", "model", &e), 0);
    assert_true(exists("model/config.json"));
    assert_true(exists("model/1_Pooling/config.json"));
    char p[128];
    snprintf(p, sizeof p, "%s/model/1_Pooling/config.json", tmp);
    FILE *f = fopen(p, "r");
    char buf[32] = "";
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "{\"a\": 1}");
    /* never over an existing directory */
    assert_int_not_equal(unpack("good", "model", &e), 0);
    assert_non_null(strstr(e.msg, "exists already"));
}

static void hostile_archives_are_refused_and_leave_nothing(void **st) {
    (void)st;
    static const struct {
        const char *name, *spec;
    } bad[] = {
        {"dotdot", "config.json={}|../escaped=x"},
        {"deep_dotdot", "a/b/../../../escaped=x"},
        {"absolute", "config.json={}|/tmp/medley-unpack-abs-escaped=x"},
        {"backslash", "..\\escaped=x"},
        {"symlink", "config.json={}|link->/etc/passwd"},
        {"twice", "config.json={}|config.json=again"},
        {"file_then_dir", "a=file|a/b=x"},
    };
    const char *args[2 * sizeof bad / sizeof *bad];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        args[2 * i] = bad[i].name, args[2 * i + 1] = bad[i].spec;
    make_zips(args, (int)(sizeof args / sizeof *args));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char dest[64];
        snprintf(dest, sizeof dest, "d_%s", bad[i].name);
        md_err e = {0};
        int rc = unpack(bad[i].name, dest, &e);
        if (rc == 0)
            fail_msg("%s: unpacked", bad[i].name);
        if (exists(dest))
            fail_msg("%s: left %s behind", bad[i].name, dest);
    }
    assert_false(exists("escaped"));
    struct stat s;
    assert_int_not_equal(lstat("/tmp/medley-unpack-abs-escaped", &s), 0);
}

static void a_missing_or_broken_archive_is_an_error(void **st) {
    (void)st;
    md_err e = {0};
    assert_int_not_equal(unpack("nothing", "d_nothing", &e), 0);
    char p[128];
    snprintf(p, sizeof p, "%s/notzip.zip", tmp);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("not a zip", f);
    fclose(f);
    assert_int_not_equal(unpack("notzip", "d_notzip", &e), 0);
    assert_false(exists("d_notzip"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_good_archive_gives_its_directory),
        cmocka_unit_test(hostile_archives_are_refused_and_leave_nothing),
        cmocka_unit_test(a_missing_or_broken_archive_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
