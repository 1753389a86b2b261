/* test_queue_online.c — queue/online.c: the online lane's keys and ids, and the streaming cut
 * (q_online_publishable): a tail that may still become a stop string is held back, nothing
 * else is, and the cut never splits a UTF-8 character. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "queue/online.h"
#include "queue/queue.h"

static size_t cut(const char *text, const char *s0, const char *s1) {
    const char *stop[2] = {s0, s1};
    int n = s1 ? 2 : s0 ? 1 : 0;
    return q_online_publishable(text, strlen(text), stop, n);
}

static void keys_follow_the_protocol(void **st) {
    (void)st;
    char k[Q_KEY_MAX];
    q_key_online(k, "medley:", "smollm2-135m");
    assert_string_equal(k, "medley:online:{smollm2-135m}");
    q_key_reply(k, "p:", "abc");
    assert_string_equal(k, "p:reply:{abc}");
    q_key_cancel(k, "p:", "abc");
    assert_string_equal(k, "p:cancel:{abc}");
    assert_true(q_online_id_ok("0123abcdef_-"));
    assert_false(q_online_id_ok(""));
    assert_false(q_online_id_ok("a}b"));
    assert_false(q_online_id_ok("../x"));
    assert_true(q_online_model_ok("smollm2-135m"));
    assert_true(q_online_model_ok("org/model:q4"));
    assert_false(q_online_model_ok("a b"));
    assert_false(q_online_model_ok("a{b"));
    assert_false(q_online_model_ok(""));
    assert_false(q_online_model_ok("caf\xc3\xa9"));
}

static void a_tail_that_may_become_a_stop_string_is_held_back(void **st) {
    (void)st;
    assert_int_equal(cut("Hello wor", NULL, NULL), 9);
    assert_int_equal(cut("Hello wor", "world", NULL), 6); /* "wor" may become "world" */
    assert_int_equal(cut("Hello wox", "world", NULL), 9); /* it cannot any more */
    assert_int_equal(cut("Hello w", "xyz", "w!"), 6);     /* the second stop string */
    assert_int_equal(cut("aaa", "aab", NULL), 1);         /* the longest start wins */
    assert_int_equal(cut("end\n\n", "\n\n\n", "\n"), 3);  /* a whole stop string too */
    assert_int_equal(cut("", "x", NULL), 0);
    assert_int_equal(cut("ab", "abcdef", NULL), 0);
    /* a stop string starting with a 2-byte character: the cut is before its first byte */
    assert_int_equal(cut("na\xc3\xaf", "\xc3\xafve", NULL), 2);
    assert_int_equal(cut("caf\xc3\xa9", "\xc3\xa9t\xc3\xa9", NULL), 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keys_follow_the_protocol),
        cmocka_unit_test(a_tail_that_may_become_a_stop_string_is_held_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
