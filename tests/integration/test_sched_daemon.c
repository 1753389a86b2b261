/* test_sched_daemon.c — `medley scheduler` against a real redis-server started on a free
 * port: the plan is built from heartbeats and stream backlogs, published with a version
 * and an event; one scheduler holds the lease; a vanished worker triggers a re-plan at
 * once, while an unchanged fleet does not re-plan (hysteresis); a thousand workers from
 * heartbeats plan, on their own GPUs, the same twice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scheduler/sched.h"

static pid_t server;
static int port;
static char url[64];
static redisContext *rc;

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len)) {
        close(s);
        return -1;
    }
    int p = ntohs(a.sin_port);
    close(s);
    return p;
}

static int setup(void **st) {
    port = free_port();
    if (port <= 0)
        return -1;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    server = fork();
    if (server == 0) {
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) {
        usleep(50000);
        rc = redisConnect("127.0.0.1", port);
        if (rc && !rc->err)
            break;
        if (rc)
            redisFree(rc);
        rc = NULL;
    }
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);
    return rc ? 0 : -1;
}

static int teardown(void **st) {
    if (rc)
        redisFree(rc);
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    return 0;
}

static void cmd(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    assert_non_null(r);
    assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
}

static long long plan_version(char **json) {
    redisReply *r = redisCommand(rc, "GET medley:plan");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        json_t *doc = json_loads(r->str, 0, NULL);
        v = json_integer_value(json_object_get(doc, "version"));
        if (json)
            *json = strdup(r->str);
        json_decref(doc);
    }
    freeReplyObject(r);
    return v;
}

/* A backlog of n entries on model's queue, its consumer group made. */
static void backlog(const char *model, int n) {
    cmd("XGROUP CREATE medley:q:%s workers $ MKSTREAM", model);
    cmd("EVAL %s 1 medley:q:%s %d",
        "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'batch', 'b1') end",
        model, n);
}

/* One pass of the daemon (--once) with the built-in catalog; it must succeed. */
static void daemon_once(void) {
    sched_catalog cat;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    sched_daemon_opts o = {url, "medley:", NULL, 0.1, 5000, 60, 0.1, 1};
    int rc = sched_daemon_run(&o, &cat, NULL, &e);
    if (rc)
        print_error("%s\n", e.msg);
    assert_int_equal(rc, 0);
    sched_catalog_free(&cat);
}

static void seed_fleet(void) {
    cmd("FLUSHALL");
    cmd("HSET medley:worker:w1 host h1 state running devices %s",
        "[{\"type\":\"L4\"},{\"type\":\"L4\"}]");
    cmd("HSET medley:worker:w2 host h2 state running devices %s", "[\"A100-80GB-SXM\"]");
    cmd("HSET medley:worker:w3 host h3 state running devices %s", "[{\"type\":\"NoSuchGPU\"}]");
    /* a worker not told its catalog type: recognised by the driver's name and memory */
    cmd("HSET medley:worker:w4 host h4 state running devices %s",
        "[{\"type\":\"cuda\",\"name\":\"NVIDIA H100 80GB HBM3\",\"memory_bytes\":85520809984,"
        "\"tokens_per_s\":0}]");
    cmd("XGROUP CREATE medley:q:llama-3-8b workers $ MKSTREAM");
    for (int i = 0; i < 40; i++)
        cmd("XADD medley:q:llama-3-8b * batch b1 line %s", "{\"custom_id\":\"x\"}");
}

static void once_publishes_a_plan_and_an_event(void **st) {
    seed_fleet();
    redisContext *sub = redisConnect("127.0.0.1", port);
    assert_non_null(sub);
    redisReply *r = redisCommand(sub, "SUBSCRIBE medley:events");
    freeReplyObject(r);
    daemon_once();
    char *js = NULL;
    assert_int_equal(plan_version(&js), 1);
    json_t *doc = json_loads(js, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(doc, "kind")), "medley.plan");
    json_t *reps = json_object_get(doc, "replicas");
    assert_true(json_array_size(reps) >= 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(reps, 0), "model")),
                        "llama-3-8b");
    /* GPU ids name the workers that hold them; the unknown type is left out. */
    assert_non_null(strstr(js, "\"w"));
    assert_null(strstr(js, "w3/"));
    /* w4 (type "cuda", "NVIDIA H100 80GB HBM3") is in the fleet as an H100-SXM */
    assert_non_null(strstr(js, "\"w4/0\""));
    assert_non_null(strstr(js, "H100-SXM"));
    json_decref(doc);
    free(js);
    struct timeval tv = {2, 0};
    redisSetTimeout(sub, tv);
    assert_int_equal(redisGetReply(sub, (void **)&r), REDIS_OK);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_string_equal(r->element[0]->str, "message");
    json_t *ev = json_loads(r->element[2]->str, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(ev, "type")), "plan");
    assert_int_equal(json_integer_value(json_object_get(ev, "version")), 1);
    json_decref(ev);
    freeReplyObject(r);
    redisFree(sub);
    /* The lease was handed back. */
    r = redisCommand(rc, "EXISTS medley:scheduler:lease");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
}

/* Issue 26 item 7: the $/h a worker reports in its heartbeat overrides the catalog's price
 * (split over its GPUs), and the plan records per stage which price it used. */
static void heartbeat_price_overrides_the_catalog(void **st) {
    seed_fleet();
    /* w1's two L4s cost $0.20/h in all (the catalog says $0.70/h each); w4 reports no price */
    cmd("HSET medley:worker:w1 usd_per_hour 0.2");
    cmd("HSET medley:worker:w2 usd_per_hour garbage");
    daemon_once();
    char *js = NULL;
    assert_int_equal(plan_version(&js), 1);
    json_t *doc = json_loads(js, 0, NULL);
    size_t i, j;
    json_t *r, *s;
    int w1 = 0, other = 0;
    json_array_foreach(json_object_get(doc, "replicas"), i, r) {
        json_array_foreach(json_object_get(r, "stages"), j, s) {
            const char *gpu = json_string_value(json_array_get(json_object_get(s, "gpus"), 0));
            double usd = json_number_value(json_object_get(s, "usd_per_gpu_hour"));
            const char *src = json_string_value(json_object_get(s, "price_source"));
            print_message("stage on %s: $%.3f/h per GPU from %s\n", gpu, usd, src);
            if (!strncmp(gpu, "w1/", 3)) {
                w1++;
                assert_true(fabs(usd - 0.1) < 1e-9);
                assert_string_equal(src, "heartbeat");
            } else {
                other++;
                assert_string_equal(src, "catalog"); /* garbage or no price: the catalog's */
            }
        }
    }
    /* at $0.10 per L4 the cheap worker is in the plan */
    assert_true(w1 >= 1);
    (void)other;
    json_decref(doc);
    free(js);
}

static void lease_keeps_a_second_scheduler_out(void **st) {
    seed_fleet();
    cmd("SET medley:scheduler:lease someone-else PX 10000");
    sched_catalog cat;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    sched_daemon_opts o = {url, "medley:", NULL, 0.1, 5000, 60, 0.1, 1};
    assert_int_equal(sched_daemon_run(&o, &cat, NULL, &e), MD_EREDIS);
    assert_non_null(strstr(e.msg, "lease"));
    assert_int_equal(plan_version(NULL), -1);
    redisReply *r = redisCommand(rc, "GET medley:scheduler:lease");
    assert_string_equal(r->str, "someone-else");
    freeReplyObject(r);
    sched_catalog_free(&cat);
}

typedef struct run_arg {
    sched_daemon_opts o;
    sched_catalog *cat;
    volatile int stop;
    int rc;
} run_arg;

static void *run_daemon(void *p) {
    run_arg *a = p;
    md_err e = {0};
    a->rc = sched_daemon_run(&a->o, a->cat, &a->stop, &e);
    return NULL;
}

static long long wait_version(long long want, double timeout_s) {
    long long v = -1;
    for (double t = 0; t < timeout_s; t += 0.05) {
        v = plan_version(NULL);
        if (v >= want)
            break;
        usleep(50000);
    }
    return v;
}

static void vanished_worker_replans_at_once_and_steady_fleet_does_not(void **st) {
    seed_fleet();
    sched_catalog cat;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    run_arg a = {{url, "medley:", NULL, 0.1, 5000, 60, 0.1, 0}, &cat, 0, -99};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_daemon, &a), 0);
    assert_int_equal(wait_version(1, 10), 1);
    /* Steady fleet and backlog: several rounds, no new plan. */
    usleep(600000);
    assert_int_equal(plan_version(NULL), 1);
    /* Worker w2 (the A100) stops heartbeating: its key expires. */
    cmd("DEL medley:worker:w2");
    assert_int_equal(wait_version(2, 10), 2);
    char *js = NULL;
    plan_version(&js);
    assert_null(strstr(js, "w2/"));
    assert_non_null(strstr(js, "fleet changed"));
    free(js);
    a.stop = 1;
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    sched_catalog_free(&cat);
}

/* 1,000 single-GPU workers and 25 workers of 8 H100s, as heartbeats: the daemon merges them
 * into one pool per kind of host, plans (never a false "no solution"), names the workers'
 * own GPUs with every TP group on one worker, and plans the same twice. */
static void many_workers_from_heartbeats_plan_the_same_twice(void **st) {
    static const char *types[] = {"L4", "A10G", "A100-80GB-SXM", "H100-SXM"};
    cmd("FLUSHALL");
    for (int i = 0; i < 1025; i++) {
        char id[16], devs[256] = "[";
        snprintf(id, sizeof id, i < 1000 ? "s%04d" : "e%02d", i < 1000 ? i : i - 1000);
        for (int g = 0; g < (i < 1000 ? 1 : 8); g++)
            snprintf(devs + strlen(devs), sizeof devs - strlen(devs), "%s\"%s\"", g ? "," : "",
                     i < 1000 ? types[i % 4] : "H100-SXM");
        strcat(devs, "]");
        redisAppendCommand(rc, "HSET medley:worker:%s host %s state running devices %s", id, id,
                           devs);
    }
    for (int i = 0; i < 1025; i++) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(rc, (void **)&r), REDIS_OK);
        freeReplyObject(r);
    }
    const char *models[] = {"llama-3-8b", "mistral-7b", "llama-3-70b"};
    for (int m = 0; m < 3; m++) {
        cmd("XGROUP CREATE medley:q:%s workers $ MKSTREAM", models[m]);
        for (int i = 0; i < 20; i++)
            cmd("XADD medley:q:%s * batch b1 line %s", models[m], "{\"custom_id\":\"x\"}");
    }
    char wl[] = "/tmp/medley-sched-wl-XXXXXX";
    int fd = mkstemp(wl);
    assert_true(fd >= 0);
    const char *doc =
        "{\"models\":[{\"model\":\"llama-3-8b\",\"rate_rps\":150,\"input_mean\":512,\"output_"
        "mean\":256},"
        "{\"model\":\"mistral-7b\",\"rate_rps\":100,\"input_mean\":512,\"output_mean\":256},"
        "{\"model\":\"llama-3-70b\",\"rate_rps\":20,\"input_mean\":512,\"output_mean\":256}]}";
    assert_int_equal(write(fd, doc, strlen(doc)), (ssize_t)strlen(doc));
    close(fd);
    sched_catalog cat;
    md_err e = {0};
    assert_int_equal(sched_catalog_load(&cat, NULL, &e), 0);
    sched_daemon_opts o = {url, "medley:", wl, 0.1, 60000, 60, 0.1, 1};
    json_t *reps[2];
    for (int run = 0; run < 2; run++) {
        assert_int_equal(sched_daemon_run(&o, &cat, NULL, &e), 0);
        char *js = NULL;
        assert_int_equal(plan_version(&js), run + 1);
        json_t *plan = json_loads(js, 0, NULL);
        free(js);
        reps[run] = json_incref(json_object_get(plan, "replicas"));
        json_decref(plan);
    }
    unlink(wl);
    assert_true(json_array_size(reps[0]) >= 10);
    assert_true(json_equal(reps[0], reps[1]));
    size_t i, s, g;
    json_t *r, *stg, *id;
    int tp_groups = 0;
    json_array_foreach(reps[0], i, r) json_array_foreach(json_object_get(r, "stages"), s, stg) {
        const char *first = json_string_value(json_array_get(json_object_get(stg, "gpus"), 0));
        const char *slash = strchr(first, '/');
        assert_non_null(slash);
        assert_true(first[0] == 's' || first[0] == 'e');
        tp_groups += json_array_size(json_object_get(stg, "gpus")) > 1;
        json_array_foreach(json_object_get(stg, "gpus"), g, id) {
            const char *v = json_string_value(id);
            assert_int_equal(strncmp(v, first, (size_t)(slash - first + 1)), 0);
            if (first[0] == 's')
                assert_string_equal(slash, "/0");
        }
    }
    assert_true(tp_groups > 0); /* llama-3-70b needs a TP group: on one 8-GPU worker */
    json_decref(reps[0]);
    json_decref(reps[1]);
    sched_catalog_free(&cat);
}

/* Issue 39 item 8: worker ids as long as a host can make them (the default
 * "<host>-<pid>-<hex>" on an EC2 or GKE node is 44+ characters) are planned whole: every GPU
 * id of the published plan names a live worker (or "<worker>#<type>"), never a cut name; ids
 * the fleet cannot hold (a '/', over 255 characters) are left out with a warning. */
static void long_worker_ids_name_their_workers(void **st) {
    cmd("FLUSHALL");
    static char ids[5][300];
    size_t lens[5] = {44, 47, 100, 255, 256};
    const char *stem = "ip-172-31-45-123.ec2.internal-123456-deadbeef";
    for (int i = 0; i < 5; i++) {
        for (size_t k = 0; k < lens[i]; k++)
            ids[i][k] = k < strlen(stem) ? stem[k] : 'x';
        ids[i][lens[i] - 1] = (char)('0' + i);
        ids[i][lens[i]] = 0;
        cmd("HSET medley:worker:%s host h state running devices %s", ids[i],
            "[{\"type\":\"L4\"},{\"type\":\"L4\"}]");
    }
    /* two types on one worker: pools "<id>#L4" and "<id>#T4" */
    cmd("HSET medley:worker:%s host h state running devices %s", ids[0] + 3,
        "[{\"type\":\"L4\"},{\"type\":\"T4\"}]");
    cmd("HSET medley:worker:rack/7 host h state running devices %s", "[{\"type\":\"L4\"}]");
    /* a backlog that wants every GPU */
    backlog("llama-3-8b", 200000);
    daemon_once();
    char *js = NULL;
    assert_int_equal(plan_version(&js), 1);
    json_t *doc = json_loads(js, 0, NULL);
    size_t i, s, g;
    json_t *r, *stg, *id;
    int used[6] = {0}, n = 0;
    json_array_foreach(json_object_get(doc, "replicas"), i, r)
        json_array_foreach(json_object_get(r, "stages"), s, stg)
            json_array_foreach(json_object_get(stg, "gpus"), g, id) {
        const char *v = json_string_value(id);
        const char *slash = strrchr(v, '/');
        assert_non_null(slash);
        size_t nl = (size_t)(slash - v);
        int who = -1;
        for (int w = 0; w < 4; w++)
            if (nl == strlen(ids[w]) && !strncmp(v, ids[w], nl))
                who = w;
        if (nl > strlen(ids[0] + 3) && !strncmp(v, ids[0] + 3, strlen(ids[0] + 3)) &&
            v[strlen(ids[0] + 3)] == '#')
            who = 4;
        if (who < 0)
            print_message("GPU id names no live worker: %s\n", v);
        assert_true(who >= 0);
        used[who]++;
        n++;
    }
    assert_true(n >= 8);
    for (int w = 0; w < 4; w++)
        assert_true(used[w] <= 2);
    assert_null(strstr(js, ids[4])); /* 256 characters: left out */
    assert_null(strstr(js, "rack/7"));
    json_decref(doc);
    free(js);
}

/* Issue 39 item 14: CPU devices are planned like any type. A CPU-only fleet (two workers whose
 * heartbeats list one `cpu` device each) gets a plan with replicas on "<worker>/0"; a worker
 * with an L4 and its host CPU is two pools, "<worker>#L4" and "<worker>#cpu". Before, every
 * `cpu` device was dropped with a warning and a CPU-only fleet got no plan. */
static void cpu_devices_are_planned(void **st) {
    cmd("FLUSHALL");
    cmd("HSET medley:worker:c1 host h1 state running devices %s",
        "[{\"type\":\"cpu\",\"memory_bytes\":68719476736,\"tokens_per_s\":0}]");
    cmd("HSET medley:worker:c2 host h2 state running devices %s",
        "[{\"type\":\"cpu\",\"memory_bytes\":68719476736,\"tokens_per_s\":0}]");
    backlog("smollm2-135m", 3000);
    daemon_once();
    char *js = NULL;
    assert_int_equal(plan_version(&js), 1);
    print_message("CPU-only plan: %.300s...\n", js);
    json_t *doc = json_loads(js, 0, NULL);
    json_t *reps = json_object_get(doc, "replicas");
    assert_true(json_array_size(reps) >= 1);
    json_t *s0 = json_array_get(json_object_get(json_array_get(reps, 0), "stages"), 0);
    assert_string_equal(json_string_value(json_object_get(s0, "gpu_type")), "cpu");
    const char *id = json_string_value(json_array_get(json_object_get(s0, "gpus"), 0));
    assert_true(!strcmp(id, "c1/0") || !strcmp(id, "c2/0"));
    json_decref(doc);
    free(js);
    /* an L4 and the host's CPU on one worker: a pool each */
    cmd("HSET medley:worker:g1 host h3 state running devices %s",
        "[{\"type\":\"L4\",\"memory_bytes\":24152899584,\"tokens_per_s\":0},"
        "{\"type\":\"cpu\",\"memory_bytes\":68719476736,\"tokens_per_s\":0}]");
    daemon_once();
    assert_int_equal(plan_version(&js), 2);
    assert_non_null(strstr(js, "\"g1#L4/0\""));
    free(js);
}

/* A CPU host's memory is its heartbeat's memory_bytes (docs/protocol.md), not the catalog's
 * 16 GB slice: llama-2-13b (26 GB of BF16 weights) is planned on a 64 GiB host, and a fleet
 * of an 8 GiB host alone gets no plan for it (before, both were 16 GB: neither held it). */
static void cpu_host_memory_comes_from_the_heartbeat(void **st) {
    cmd("FLUSHALL");
    cmd("HSET medley:worker:small host h1 state running devices %s",
        "[{\"type\":\"cpu\",\"memory_bytes\":8589934592,\"tokens_per_s\":0}]");
    backlog("llama-2-13b", 50);
    daemon_once();
    char *js = NULL;
    assert_true(plan_version(&js) <= 0);
    free(js);
    cmd("HSET medley:worker:big host h2 state running devices %s",
        "[{\"type\":\"cpu\",\"memory_bytes\":68719476736,\"tokens_per_s\":0}]");
    daemon_once();
    assert_int_equal(plan_version(&js), 1);
    json_t *doc = json_loads(js, 0, NULL);
    json_t *reps = json_object_get(doc, "replicas");
    assert_int_equal(json_array_size(reps), 1);
    json_t *s0 = json_array_get(json_object_get(json_array_get(reps, 0), "stages"), 0);
    assert_string_equal(json_string_value(json_array_get(json_object_get(s0, "gpus"), 0)), "big/0");
    json_decref(doc);
    free(js);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(once_publishes_a_plan_and_an_event),
        cmocka_unit_test(heartbeat_price_overrides_the_catalog),
        cmocka_unit_test(lease_keeps_a_second_scheduler_out),
        cmocka_unit_test(vanished_worker_replans_at_once_and_steady_fleet_does_not),
        cmocka_unit_test(many_workers_from_heartbeats_plan_the_same_twice),
        cmocka_unit_test(long_worker_ids_name_their_workers),
        cmocka_unit_test(cpu_devices_are_planned),
        cmocka_unit_test(cpu_host_memory_comes_from_the_heartbeat),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
