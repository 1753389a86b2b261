#!/usr/bin/env python3
"""redis_roles.py — a Redis user per role (docs/operations.md, "A Redis user per role"),
against a real redis-server loaded with deploy/redis/users.acl as checked in (placeholder
passwords replaced, one per user):

1. End to end with every role on its own user: `medley submit` (2,000 lines) and `status`,
   `results`, `batches` as medley-client, a second batch as medley-api, two workers as
   medley-worker (a --model worker and a stage-key owner's script by SHA), `medley scheduler
   --once` as medley-scheduler, `medley dashboard` reading batches, fleet, plan and DLQ as
   medley-dashboard and writing its actions (cancel of a batch nobody serves, whose queued
   lines it answers; drain; undrain) through --operator-redis as medley-operator. Every
   custom_id once; the ACL log holds no refusal. A dashboard without --operator-redis on
   medley-dashboard alone cannot cancel (NOPERM: that user writes nothing).
2. Per role, what a stolen credential must not do is refused with NOPERM: forged requests
   (XADD to a queue), DEL / XTRIM / expiring a queue, XGROUP DESTROY, EVAL of any script
   (worker), SCRIPT LOAD (worker), SELECT (every role), reading answers (worker), keys
   outside medley:*, SUBSCRIBE, FLUSHALL, CONFIG, ACL, KEYS, and per role the writes of the
   others (a client's XACK/XCLAIM/SADD done, a scheduler's HSET of a batch, any write of the
   dashboard's, an operator's XADD to a queue...). ~10 s."""
import json
import os
import subprocess
import sys
import time

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import chat_line, exactly_once, fail, free_port, medley, write_lines  # noqa: E402
from dashboard_util import Dashboard  # noqa: E402

ROLES = ("client", "worker", "scheduler", "dashboard", "operator", "api", "admin")
ADMIN_PW = "test-admin-pw-0123456789"
N = 2000


def pw(role):
    return "pw-%s-0123456789" % role


class RoleServer:
    """What harness helpers need of a server (dir, url), with a role's credentials."""

    def __init__(self, srv, role):
        self.dir = srv.dir
        self.url = "redis://medley-%s:%s@127.0.0.1:%d/0" % (role, pw(role), srv.port)


def start_server():
    with open(os.path.join(harness.SOURCE_DIR, "deploy", "redis", "users.acl")) as f:
        users = f.read()
    if users.count(">CHANGE-ME") != len(ROLES) + 1:
        fail("deploy/redis/users.acl should carry the placeholder >CHANGE-ME for every user")
    lines = []
    for l in users.splitlines():
        w = l.split()
        if len(w) > 1 and w[1].startswith("medley-"):
            l = l.replace(">CHANGE-ME", ">" + pw(w[1][len("medley-"):]))
        lines.append(l)
    lines.append("user test-admin on >%s ~* &* +@all" % ADMIN_PW)
    d = __import__("tempfile").mkdtemp(prefix="medley-roles-")
    with open(os.path.join(d, "users.acl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return AclServer(args=["--aclfile", os.path.join(d, "users.acl")])


class AclServer(harness.RedisServer):
    """The default user is off: the harness's own checks go through the test admin."""

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, username="test-admin",
                           password=ADMIN_PW, decode_responses=True, socket_timeout=30)


def as_role(srv, role):
    return redis.Redis(host="127.0.0.1", port=srv.port, username="medley-" + role,
                       password=pw(role), decode_responses=True, socket_timeout=10)


def admin(srv):
    return srv.client()


def refused(role, what, fn):
    try:
        fn()
    except redis.exceptions.NoPermissionError:
        return
    except redis.exceptions.ResponseError as e:
        # a refusal inside a script comes back as a script error naming the ACL
        if "NOPERM" in str(e) or "no permissions" in str(e) or \
                "user executing the script can't access" in str(e):
            return
        fail("medley-%s: %s failed, but not with NOPERM: %s" % (role, what, e))
    fail("medley-%s may %s" % (role, what))


def forbidden(srv, batch):
    meta, out, done = ("medley:{%s}:%s" % (batch, k) for k in ("meta", "out", "done"))
    q = "medley:q:{echo}"
    common = [
        ("SELECT another database", lambda r: r.execute_command("SELECT", "1")),
        ("read a key outside medley:*", lambda r: r.get("other:secret")),
        ("FLUSHALL", lambda r: r.flushall()),
        ("CONFIG GET", lambda r: r.config_get("dir")),
        ("ACL LIST", lambda r: r.acl_list()),
        ("KEYS", lambda r: r.keys("*")),
        ("SUBSCRIBE", lambda r: r.execute_command("SUBSCRIBE", "medley:events")),
        ("DEL a queue", lambda r: r.delete(q)),
        ("XTRIM a queue", lambda r: r.xtrim(q, maxlen=0)),
        ("XGROUP DESTROY", lambda r: r.xgroup_destroy(q, "workers")),
        ("SCRIPT FLUSH", lambda r: r.script_flush()),
        ("PUBLISH on another channel", lambda r: r.publish("medley:other", "x")),
    ]
    per_role = {
        "worker": [
            ("XADD a forged request to a queue", lambda r: r.xadd(q, {"batch": batch, "line": "{}"})),
            ("EVAL any script", lambda r: r.eval("return 1", 0)),
            ("EVAL a busy loop", lambda r: r.eval("while true do end", 0)),
            ("SCRIPT LOAD", lambda r: r.script_load("return 1")),
            ("read a batch's answers", lambda r: r.xrange(out)),
            ("PEXPIRE a queue", lambda r: r.pexpire(q, 1)),
            ("SET the plan", lambda r: r.set("medley:plan", "{}")),
            ("ZADD the batch index", lambda r: r.zadd("medley:batches", {"x": 1})),
            ("SET over a queue", lambda r: r.set(q, "x")),
            ("XADD into a batch's meta", lambda r: r.xadd(meta, {"a": "b"})),
        ],
        "client": [
            ("XREADGROUP as a fake consumer", lambda r: r.xreadgroup("workers", "fake", {q: ">"})),
            ("XACK", lambda r: r.xack(q, "workers", "0-1")),
            ("XCLAIM", lambda r: r.xclaim(q, "workers", "fake", 0, ["0-1"])),
            ("XDEL from a queue", lambda r: r.xdel(q, "0-1")),
            ("SADD a done custom_id", lambda r: r.sadd(done, "c1")),
            ("XADD a forged answer", lambda r: r.xadd(out, {"custom_id": "c1", "ok": "1", "line": "{}"})),
            ("HSET a worker's heartbeat", lambda r: r.hset("medley:worker:{w}", "drain", "1")),
            ("SET the plan", lambda r: r.set("medley:plan", "{}")),
        ],
        "scheduler": [
            ("XADD a forged request", lambda r: r.xadd(q, {"batch": batch, "line": "{}"})),
            ("HSET a batch", lambda r: r.hset(meta, "status", "completed")),
            ("XREADGROUP", lambda r: r.xreadgroup("workers", "fake", {q: ">"})),
            ("DEL the plan", lambda r: r.delete("medley:plan")),
            ("EVAL writing a batch", lambda r: r.eval("return redis.call('HSET', KEYS[1], 'status', 'x')", 1, meta)),
            ("HSET a heartbeat", lambda r: r.hset("medley:worker:{w}", "drain", "1")),
        ],
        # read-only: its actions write through medley-operator (docs/operations.md)
        "dashboard": [
            ("XADD a forged request", lambda r: r.xadd(q, {"batch": batch, "line": "{}"})),
            ("XADD a forged answer", lambda r: r.xadd(out, {"custom_id": "c1", "ok": "1", "line": "{}"})),
            ("XACK", lambda r: r.xack(q, "workers", "0-1")),
            ("XDEL from a queue", lambda r: r.xdel(q, "0-1")),
            ("SADD a done custom_id", lambda r: r.sadd(done, "c1")),
            ("HSET a batch", lambda r: r.hset(meta, "status", "cancelled")),
            ("HSET a worker's heartbeat", lambda r: r.hset("medley:worker:{w}", "drain", "1")),
            ("SET a drain key", lambda r: r.set("medley:drain:{w}", "1")),
            ("DEL a drain key", lambda r: r.delete("medley:drain:{w}")),
            ("SET the plan", lambda r: r.set("medley:plan", "{}")),
            ("EVAL anything", lambda r: r.eval("return 1", 0)),
            ("EVAL on a batch", lambda r: r.eval("return 1", 1, meta)),
            ("HSET a queue", lambda r: r.hset(q, "a", "b")),
            ("XREADGROUP", lambda r: r.xreadgroup("workers", "fake", {q: ">"})),
        ],
        # the dashboard's actions and no more
        "operator": [
            ("XADD a forged request", lambda r: r.xadd(q, {"batch": batch, "line": "{}"})),
            ("XREADGROUP", lambda r: r.xreadgroup("workers", "fake", {q: ">"})),
            ("read a queue", lambda r: r.xrange(q)),
            ("read a batch's answers", lambda r: r.xrange(out)),
            ("XTRIM a batch's answers", lambda r: r.xtrim(out, maxlen=0)),
            ("DEL a batch's answers", lambda r: r.delete(out)),
            ("SET the plan", lambda r: r.set("medley:plan", "{}")),
            ("ZADD the batch index", lambda r: r.zadd("medley:batches", {"x": 1})),
            ("HSET a queue", lambda r: r.hset(q, "a", "b")),
            ("EVAL on a queue", lambda r: r.eval("return 1", 1, q)),
            # (its EVAL runs any script, but each call inside still needs the user's rights)
            ("EVAL on no key adding a request", lambda r: r.eval(
                "return redis.call('XADD', '%s', '*', 'batch', 'x', 'line', '{}')" % q, 0)),
            ("EVAL on no key deleting answers", lambda r: r.eval(
                "return redis.call('DEL', '%s')" % out, 0)),
        ],
    }
    per_role["api"] = per_role["client"]
    n = 0
    for role in ("client", "worker", "scheduler", "dashboard", "operator", "api"):
        r = as_role(srv, role)
        for what, fn in common + per_role[role]:
            refused(role, what, lambda: fn(r))
            n += 1
        r.close()
    # the admin may SELECT and rotate, but reaches no key outside medley:*
    a = as_role(srv, "admin")
    a.execute_command("SELECT", "0")
    refused("admin", "read a key outside medley:*", lambda: a.get("other:secret"))
    refused("admin", "FLUSHALL", lambda: a.flushall())
    print("ok forbidden: %d refusals with NOPERM over 7 roles" % (n + 2))


def end_to_end(srv):
    t0 = time.time()
    client, worker, sched, dash, oper, api = (
        RoleServer(srv, r) for r in ("client", "worker", "scheduler", "dashboard", "operator", "api"))
    ids = ["c%d" % i for i in range(N)]
    path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "hello %s" % c) for c in ids])
    workers = [harness.Worker(worker, args=["--id", "role-w%d" % i, "--heartbeat-ms", "300"],
                              name="w%d" % i) for i in range(2)]
    try:
        b = medley("submit", path, "--redis", client.url, "--batch-id", "roles-1").stdout.strip()
        b2 = medley("submit", path, "--redis", api.url, "--batch-id", "roles-api").stdout.strip()
        ad = admin(srv)
        deadline = time.time() + 30
        while time.time() < deadline:
            st = [ad.hget("medley:{%s}:meta" % x, "status") for x in (b, b2)]
            if st == ["completed", "completed"]:
                break
            time.sleep(0.1)
        else:
            fail("batches did not complete under the role users: %s\n%s" % (
                st, workers[0].logs()[-3000:]))
        for x, u in ((b, client), (b2, api)):
            out = os.path.join(srv.dir, x + ".out")
            medley("results", x, "--redis", u.url, "-o", out)
            with open(out) as f:
                exactly_once([json.loads(l) for l in f], ids)
            st = json.loads(medley("status", x, "--json", "--redis", u.url).stdout)
            if st["request_counts"]["completed"] != N:
                fail("medley status %s as %s: %s" % (x, u.url, st))
        if b not in medley("batches", "--redis", client.url).stdout:
            fail("medley batches as medley-client does not list %s" % b)
        p = medley("scheduler", "--once", "--redis", sched.url, check=False, timeout=60)
        if p.returncode != 0:
            fail("medley scheduler --once as medley-scheduler exited %d: %s" % (
                p.returncode, p.stderr[-2000:]))
        # the dashboard reads everything as medley-dashboard; its actions write as
        # medley-operator: the cancel of a batch nobody serves (its queued lines answered
        # batch_cancelled), a drain and an undrain
        idle = write_lines(srv.dir, "idle.jsonl", [chat_line("i%d" % i, "x", model="idle")
                                                   for i in range(3)])
        medley("submit", idle, "--redis", client.url, "--batch-id", "roles-idle")
        tok = os.path.join(srv.dir, "token")
        with open(tok, "w") as f:
            f.write("tok-0123456789abcdef0123\n")
        d = Dashboard(dash, ["--admin-token-file", tok], env={"MEDLEY_OPERATOR_REDIS": oper.url})
        try:
            for path_ in ("/api/batches", "/api/fleet", "/api/plan", "/api/dlq"):
                st, doc = d.request("GET", path_)
                if st != 200:
                    fail("dashboard as medley-dashboard: GET %s -> %d %s" % (path_, st, doc))
            st, doc = d.post("/api/cancel?batch=roles-idle", token="tok-0123456789abcdef0123")
            if st != 200 or doc.get("status") != "cancelled":
                fail("dashboard cancel through medley-operator: %d %s" % (st, doc))
            got = [json.loads(f["line"]) for _, f in ad.xrange("medley:{roles-idle}:out")]
            if sorted(x["custom_id"] for x in got) != ["i0", "i1", "i2"] or any(
                    x["error"]["code"] != "batch_cancelled" for x in got):
                fail("the unserved batch's lines were not answered batch_cancelled: %s" % got)
            if ad.xlen("medley:q:{idle}"):
                fail("the unserved batch's queued lines were not acknowledged and deleted")
            st, doc = d.post("/api/drain?worker=role-w1", token="tok-0123456789abcdef0123")
            if st != 200:
                fail("dashboard drain through medley-operator: %d %s" % (st, doc))
            # a drained worker exits 10, which its unit and pod do not restart
            # (docs/operations.md)
            if workers[1].wait(30) != 10:
                fail("the drained worker did not exit 10:\n" + workers[1].logs()[-2000:])
            st, doc = d.post("/api/undrain?worker=role-w1", token="tok-0123456789abcdef0123")
            if st != 200 or ad.exists("medley:drain:{role-w1}"):
                fail("dashboard undrain through medley-operator: %d %s" % (st, doc))
        finally:
            d.stop()
        log = [e for e in ad.acl_log(count=100) if e.get("username", "").startswith("medley")]
        if log:
            fail("the ACL refused a role's own command: %s" % log[:5])
        # without --operator-redis the actions write as medley-dashboard, which may not
        medley("submit", idle, "--redis", client.url, "--batch-id", "roles-idle2")
        d = Dashboard(dash, ["--admin-token-file", tok], env={"MEDLEY_OPERATOR_REDIS": ""})
        try:
            st, doc = d.post("/api/cancel?batch=roles-idle2", token="tok-0123456789abcdef0123")
            if st == 200 or "NOPERM" not in json.dumps(doc):
                fail("a cancel as the read-only medley-dashboard: %d %s" % (st, doc))
        finally:
            d.stop()
        if ad.hget("medley:{roles-idle2}:meta", "status") != "in_progress":
            fail("the read-only dashboard changed a batch")
    finally:
        for w in workers:
            w.stop()
    print("ok end_to_end: 2 x %d lines, every role on its own user, ACL log clean (%.1f s)" % (
        N, time.time() - t0))


def main():
    srv = start_server()
    try:
        admin(srv).set("other:secret", "x")
        end_to_end(srv)
        forbidden(srv, "roles-1")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
