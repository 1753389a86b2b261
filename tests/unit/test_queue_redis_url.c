/* test_queue_redis_url.c — common/redis.c URL parsing and queue/queue.c key names and ids:
 * the forms the docs promise (redis://, unix://, sentinel://), and clear errors for the rest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/redis.h"
#include "queue/client.h"
#include "queue/queue.h"

static void tcp_url_with_user_password_and_db(void **st) {
    md_redis_url u;
    md_err e = {0};
    assert_int_equal(md_redis_url_parse("redis://alice:s%40cret@db.example:6380/3", &u, &e), 0);
    assert_string_equal(u.host, "db.example");
    assert_int_equal(u.port, 6380);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.pass, "s@cret");
    assert_int_equal(u.db, 3);
    assert_string_equal(u.unix_path, "");
    char d[256];
    md_redis_url_describe(&u, d, sizeof d);
    assert_null(strstr(d, "cret")); /* never log the password */
}

static void tcp_url_defaults(void **st) {
    md_redis_url u;
    md_err e = {0};
    assert_int_equal(md_redis_url_parse("redis://localhost", &u, &e), 0);
    assert_string_equal(u.host, "localhost");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.user, "");
    assert_int_equal(md_redis_url_parse("redis://:pw@[::1]:7000/0", &u, &e), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 7000);
    assert_string_equal(u.pass, "pw");
    assert_string_equal(u.user, "");
}

static void unix_url_with_query(void **st) {
    md_redis_url u;
    md_err e = {0};
    assert_int_equal(
        md_redis_url_parse("unix:///run/redis/r.sock?db=2&user=w&password=p%2Fq", &u, &e), 0);
    assert_string_equal(u.unix_path, "/run/redis/r.sock");
    assert_int_equal(u.db, 2);
    assert_string_equal(u.user, "w");
    assert_string_equal(u.pass, "p/q");
}

static void bad_urls_say_what_is_wrong(void **st) {
    md_redis_url u;
    md_err e = {0};
    const char *bad[] = {"",
                         "http://x",
                         "redis://host:0",
                         "redis://host:99999",
                         "redis://host:12ab",
                         "redis://host/x",
                         "redis://u:%zz@host",
                         "redis://u:%4@host",
                         "unix://relative.sock",
                         "unix:///s.sock?color=red",
                         "redis://[::1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = 0;
        if (md_redis_url_parse(bad[i], &u, &e) != MD_EINVAL)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(strstr(e.msg, "Redis URL") != NULL);
    }
}

static void sentinel_url_with_hosts_master_db_and_auth(void **st) {
    md_redis_url u;
    md_err e = {0};
    assert_int_equal(md_redis_url_parse("sentinel://w:p%40ss@s1:26380,[::1],:26400/my%2Dmaster/"
                                        "2?sentinel_user=sen&sentinel_password=t%26p",
                                        &u, &e),
                     0);
    assert_string_equal(u.master, "my-master");
    assert_int_equal(u.db, 2);
    assert_string_equal(u.user, "w");
    assert_string_equal(u.pass, "p@ss");
    assert_string_equal(u.sentinel_user, "sen");
    assert_string_equal(u.sentinel_pass, "t&p");
    assert_int_equal(u.n_sentinels, 3);
    assert_string_equal(u.sentinels[0].host, "s1");
    assert_int_equal(u.sentinels[0].port, 26380);
    assert_string_equal(u.sentinels[1].host, "::1");
    assert_int_equal(u.sentinels[1].port, 26379); /* Sentinel's default port */
    assert_string_equal(u.sentinels[2].host, "127.0.0.1");
    assert_int_equal(u.sentinels[2].port, 26400);
    assert_string_equal(u.host, "");
    assert_string_equal(u.unix_path, "");
    char d[1024];
    md_redis_url_describe(&u, d, sizeof d);
    assert_null(strstr(d, "ss")); /* neither password is logged */
    assert_null(strstr(d, "t&p"));
    assert_non_null(strstr(d, "s1:26380,::1:26379,127.0.0.1:26400/my-master/2"));
}

static void sentinel_url_minimal(void **st) {
    md_redis_url u;
    md_err e = {0};
    assert_int_equal(md_redis_url_parse("sentinel://localhost/mymaster", &u, &e), 0);
    assert_int_equal(u.n_sentinels, 1);
    assert_string_equal(u.sentinels[0].host, "localhost");
    assert_int_equal(u.sentinels[0].port, 26379);
    assert_string_equal(u.master, "mymaster");
    assert_int_equal(u.db, 0);
    assert_string_equal(u.pass, "");
    assert_string_equal(u.sentinel_pass, "");
    /* a redis:// URL is not a sentinel one */
    assert_int_equal(md_redis_url_parse("redis://localhost/1", &u, &e), 0);
    assert_string_equal(u.master, "");
    assert_int_equal(u.n_sentinels, 0);
}

static void bad_sentinel_urls_say_what_is_wrong(void **st) {
    md_redis_url u;
    md_err e = {0};
    struct {
        const char *url, *says;
    } bad[] = {
        {"sentinel://", "master name"},
        {"sentinel://h1,h2", "master name"},
        {"sentinel://h1/", "master name"},
        {"sentinel:///mymaster", "at least one host"},
        {"sentinel://u:p@/mymaster", "at least one host"},
        {"sentinel://h1,,h2/m", "empty host"},
        {"sentinel://h1,/m", "empty host"},
        {"sentinel://,h1/m", "empty host"},
        {"sentinel://h1:0/m", "1..65535"},
        {"sentinel://h1:x/m", "1..65535"},
        {"sentinel://h1:/m", "bad port"},
        {"sentinel://[::1/m", "unclosed"},
        {"sentinel://[::1]x/m", "follows"},
        {"sentinel://h1/m/x", "database"},
        {"sentinel://h1/m/1?color=red", "unknown query item 'color'"},
        {"sentinel://h1/m?sentinel_password", "no '='"},
        {"sentinel://h1/m%zz", "master name"},
        {"sentinel://a,b,c,d,e,f,g,h,i/m", "more than 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e.msg[0] = 0;
        if (md_redis_url_parse(bad[i].url, &u, &e) != MD_EINVAL)
            fail_msg("'%s' was accepted", bad[i].url);
        if (!strstr(e.msg, "Redis URL") || !strstr(e.msg, bad[i].says))
            fail_msg("'%s': the error '%s' does not say '%s'", bad[i].url, e.msg, bad[i].says);
    }
}

static void keys_share_the_batch_hash_tag(void **st) {
    char k[Q_KEY_MAX];
    q_key_meta(k, "medley:", "b1");
    assert_string_equal(k, "medley:{b1}:meta");
    q_key_out(k, "medley:", "b1");
    assert_string_equal(k, "medley:{b1}:out");
    q_key_done(k, "medley:", "b1");
    assert_string_equal(k, "medley:{b1}:done");
    q_key_queue(k, "x:", "echo");
    assert_string_equal(k, "x:q:{echo}");
    q_key_dlq(k, "medley:", "echo");
    assert_string_equal(k, "medley:dlq:{echo}");
}

static void batch_ids_and_prefixes_are_checked(void **st) {
    md_err e = {0};
    char id[Q_BATCH_ID_MAX];
    q_new_batch_id(id, sizeof id);
    assert_int_equal(strlen(id), 30);
    assert_int_equal(q_batch_id_check(id, &e), 0);
    assert_int_equal(q_batch_id_check("a{b}", &e), MD_EINVAL);
    assert_int_equal(q_batch_id_check("", &e), MD_EINVAL);
    assert_int_equal(q_prefix_check("medley:", &e), 0);
    assert_int_equal(q_prefix_check("a b", &e), MD_EINVAL);
    assert_int_equal(q_prefix_check("{x}", &e), MD_EINVAL);
}

static void durations_parse(void **st) {
    long long s = 0;
    md_err e = {0};
    assert_int_equal(q_parse_duration("24h", &s, &e), 0);
    assert_int_equal(s, 86400);
    assert_int_equal(q_parse_duration("90", &s, &e), 0);
    assert_int_equal(s, 90);
    assert_int_equal(q_parse_duration("15m", &s, &e), 0);
    assert_int_equal(s, 900);
    assert_int_equal(q_parse_duration("2w", &s, &e), MD_EINVAL);
    assert_int_equal(q_parse_duration("-1s", &s, &e), MD_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tcp_url_with_user_password_and_db),
        cmocka_unit_test(tcp_url_defaults),
        cmocka_unit_test(unix_url_with_query),
        cmocka_unit_test(bad_urls_say_what_is_wrong),
        cmocka_unit_test(sentinel_url_with_hosts_master_db_and_auth),
        cmocka_unit_test(sentinel_url_minimal),
        cmocka_unit_test(bad_sentinel_urls_say_what_is_wrong),
        cmocka_unit_test(keys_share_the_batch_hash_tag),
        cmocka_unit_test(batch_ids_and_prefixes_are_checked),
        cmocka_unit_test(durations_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
