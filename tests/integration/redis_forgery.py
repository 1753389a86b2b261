#!/usr/bin/env python3
"""redis_forgery.py — what the ACL cannot stop, the protocol does (docs/operations.md, "Threat
model"), against a real redis-server loaded with deploy/redis/users.acl:

With medley-worker's credentials, before any worker runs, a forger
  - reads 20 entries of the batch as a consumer of its own ("fake") and XACKs them unanswered
    (so the batch would wait for them for good);
  - XADDs two forged answers to the batch's output stream: one under a real custom_id with
    an entry id the batch never had, one without any entry id.
Then a real `medley worker` (as medley-worker) serves the batch. Checks: the batch
completes; `medley results` (as medley-client) writes every custom_id once with the real
answers, drops the 2 forged lines and says so (and so does `medley api`'s output file,
counting them in medley_forged_answers_total); the worker's /metrics counts the 20
unanswered acks (medley_unanswered_acks_total) and its log names the consumer 'fake' as
having no heartbeat. ~8 s."""
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import chat_line, exactly_once, fail, free_port, medley, write_lines  # noqa: E402
from redis_roles import RoleServer, as_role, start_server  # noqa: E402

N = 300
FAKE_ACKS = 20


def api_output_file(srv, b, ids):
    """`medley api` (as medley-api) serves batch b's output file without the 2 forged lines
    and counts them in medley_forged_answers_total, as `medley results` drops them. The batch
    is handed to tenant acme by its API record (P api:{B}, what POST /v1/batches writes)."""
    from api_util import KEY_A, Api, write_keys
    srv.client().hset("medley:api:{%s}" % b, mapping={"tenant": "acme"})
    mport = free_port()
    api = Api(RoleServer(srv, "api"), write_keys(srv.dir),
              ["--metrics", "127.0.0.1:%d" % mport])
    try:
        def get(path):
            req = urllib.request.Request(api.base + path,
                                         headers={"Authorization": "Bearer " + KEY_A})
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.read().decode()
        meta = json.loads(get("/files/file-out-%s" % b))
        body = get("/files/file-out-%s/content" % b)
        lines = [json.loads(l) for l in body.splitlines()]
        exactly_once(lines, ids)
        if "FORGED" in body:
            fail("a forged answer reached the API's output file")
        if meta.get("bytes") != len(body.encode()):
            fail("the output file's bytes (%s) is not what its content holds (%d)" % (
                meta.get("bytes"), len(body.encode())))
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=5) as r:
            text = r.read().decode()
        m = re.search(r"^medley_forged_answers_total (\S+)$", text, re.M)
        if not m or float(m.group(1)) != 2:
            fail("medley_forged_answers_total should be 2: %s" % (m.group(0) if m else "absent"))
        # listed once ended, then deleted, with medley-api's rights (its lines XDELed)
        srv.client().sadd("medley:tenant:{acme}:running", b)  # what POST /v1/batches adds
        listed = [f["id"] for f in json.loads(get("/files"))["data"]]
        if "file-out-%s" % b not in listed:
            fail("the output file of an ended batch is not listed: %s" % listed)
        req = urllib.request.Request(api.base + "/files/file-out-%s" % b, method="DELETE",
                                     headers={"Authorization": "Bearer " + KEY_A})
        with urllib.request.urlopen(req, timeout=10) as r:
            if not json.loads(r.read())["deleted"]:
                fail("DELETE of the output file")
        left = srv.client().xlen("medley:{%s}:out" % b)  # the forged ones carry ok 1 too
        if left != 0:
            fail("deleting the output file left %d of its lines" % left)
    finally:
        api.stop()
    print("ok api: the output file drops the 2 forged lines, medley_forged_answers_total 2; "
          "listed and deleted as medley-api")


def main():
    srv = start_server()
    worker = None
    try:
        client = RoleServer(srv, "client")
        ids = ["c%d" % i for i in range(N)]
        path = write_lines(srv.dir, "in.jsonl", [chat_line(c, "real %s" % c) for c in ids])
        b = medley("submit", path, "--redis", client.url, "--batch-id", "forged-1").stdout.strip()
        q, out = "medley:q:{echo}", "medley:{%s}:out" % b

        evil = as_role(srv, "worker")
        got = evil.xreadgroup("workers", "fake", {q: ">"}, count=FAKE_ACKS)
        taken = [eid for _, ents in got for eid, _ in ents]
        if len(taken) != FAKE_ACKS or evil.xack(q, "workers", *taken) != FAKE_ACKS:
            fail("the forger could not read and ack %d entries: %s" % (FAKE_ACKS, taken))
        forged = {"custom_id": "c1", "response": {"status_code": 200, "body": "FORGED"}}
        evil.xadd(out, {"custom_id": "c1", "ok": "1", "line": json.dumps(forged),
                        "entry": "1-1"})
        evil.xadd(out, {"custom_id": "c2", "ok": "1", "line": json.dumps(forged)})

        mport = free_port()
        worker = harness.Worker(RoleServer(srv, "worker"),
                                args=["--id", "real-w", "--visibility-ms", "1000",
                                      "--heartbeat-ms", "300", "--metrics",
                                      "127.0.0.1:%d" % mport], name="real")
        admin = srv.client()
        deadline = time.time() + 30
        while admin.hget("medley:{%s}:meta" % b, "status") != "completed":
            if time.time() > deadline:
                fail("the batch did not complete after the fake acks: %s\n%s" % (
                    admin.hgetall("medley:{%s}:meta" % b), worker.logs()[-3000:]))
            time.sleep(0.1)

        dst = os.path.join(srv.dir, "out.jsonl")
        p = medley("results", b, "--redis", client.url, "-o", dst)
        with open(dst) as f:
            lines = [json.loads(l) for l in f]
        exactly_once(lines, ids)
        if any("FORGED" in json.dumps(l) for l in lines):
            fail("a forged answer reached the results")
        if "dropped 2 line(s)" not in p.stderr:
            fail("medley results did not say it dropped the 2 forged lines: %r" % p.stderr)

        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=5) as r:
            text = r.read().decode()
        m = re.search(r'^medley_unanswered_acks_total\{model="echo"\} (\S+)$', text, re.M)
        if not m or float(m.group(1)) != FAKE_ACKS:
            fail("medley_unanswered_acks_total should be %d: %s" % (
                FAKE_ACKS, m.group(0) if m else "absent"))
        if "without a heartbeat: 'fake'" not in worker.logs():
            fail("the worker's log does not name the consumer 'fake':\n" + worker.logs()[-2000:])
        api_output_file(srv, b, ids)
        print("ok forgery: %d fake acks rerun and counted, 2 forged lines dropped, %d lines once"
              % (FAKE_ACKS, N))
    finally:
        if worker:
            worker.stop()
        srv.stop()


if __name__ == "__main__":
    main()
